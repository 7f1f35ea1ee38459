// Encoding runs on the calling thread; decoding on the connection's reading thread (the loop).
#include "ferry/rpc/frame.h"

#include <ATen/ATen.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstring>
#include <limits>

#include "rpc/tensor_cache.h"
#include "rpc/wire.capnp.h"

namespace ferry::rpc {
namespace {

struct DTypeEntry {
  at::ScalarType scalar;
  wire::DType wire;
};

constexpr DTypeEntry kDTypes[] = {
    {at::kFloat, wire::DType::FLOAT32},
    {at::kDouble, wire::DType::FLOAT64},
    {at::kHalf, wire::DType::FLOAT16},
    {at::kBFloat16, wire::DType::BFLOAT16},
    {at::kChar, wire::DType::INT8},
    {at::kShort, wire::DType::INT16},
    {at::kInt, wire::DType::INT32},
    {at::kLong, wire::DType::INT64},
    {at::kByte, wire::DType::UINT8},
    {at::kBool, wire::DType::BOOL},
    {at::kComplexFloat, wire::DType::COMPLEX64},
    {at::kComplexDouble, wire::DType::COMPLEX128},
};

wire::DType to_wire(at::ScalarType type) {
  for (const auto& entry : kDTypes) {
    if (entry.scalar == type) return entry.wire;
  }
  throw Error(ErrorKind::InvalidArgument,
              fmt::format("tensors of dtype {} cannot be sent", c10::toString(type)));
}

bool from_wire(wire::DType type, at::ScalarType* out) {
  for (const auto& entry : kDTypes) {
    if (entry.wire == type) {
      *out = entry.scalar;
      return true;
    }
  }
  return false;
}

wire::ElementType element_type_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return wire::ElementType::TENSOR;
    case c10::TypeKind::IntType:
      return wire::ElementType::INT;
    case c10::TypeKind::FloatType:
      return wire::ElementType::DOUBLE;
    case c10::TypeKind::BoolType:
      return wire::ElementType::BOOL;
    case c10::TypeKind::StringType:
      return wire::ElementType::STRING;
    default:
      return wire::ElementType::ANY;
  }
}

c10::TypePtr type_of(wire::ElementType type) {
  switch (type) {
    case wire::ElementType::TENSOR:
      return c10::TensorType::get();
    case wire::ElementType::INT:
      return c10::IntType::get();
    case wire::ElementType::DOUBLE:
      return c10::FloatType::get();
    case wire::ElementType::BOOL:
      return c10::BoolType::get();
    case wire::ElementType::STRING:
      return c10::StringType::get();
    default:
      return c10::AnyType::get();
  }
}

// Makes a tensor sendable as raw bytes: on the CPU, dense, contiguous, with no lazy conjugate or
// negative bit. A view that is already contiguous stays a view, so only its own elements are
// sent, never the rest of its storage.
at::Tensor sendable(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  if (tensor.layout() != at::kStrided || tensor.is_quantized()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("only dense tensors can be sent, got layout {}",
                            c10::toString(tensor.layout())));
  }
  at::Tensor t = tensor.detach();
  if (!t.is_cpu()) t = t.to(at::kCPU);
  t = t.resolve_conj().resolve_neg();
  if (!t.is_contiguous()) t = t.contiguous();
  return t;
}

class ValueEncoder {
 public:
  ValueEncoder(std::vector<at::Tensor>* tensors, std::vector<bool>* requires_grad, int max_depth,
               RRefCodec* rrefs, int to_rank)
      : tensors_(tensors),
        requires_grad_(requires_grad),
        max_depth_(max_depth),
        rrefs_(rrefs),
        to_rank_(to_rank) {}

  void encode(const c10::IValue& value, wire::Value::Builder out, int depth) {
    if (depth > max_depth_) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("value is nested deeper than the limit of {}", max_depth_));
    }
    if (value.isNone()) {
      out.setNone();
    } else if (value.isBool()) {
      out.setBool(value.toBool());
    } else if (value.isInt()) {
      out.setInt(value.toInt());
    } else if (value.isDouble()) {
      out.setDouble(value.toDouble());
    } else if (value.isString()) {
      const std::string& s = value.toStringRef();
      out.setString(capnp::Text::Reader(s.data(), s.size()));
    } else if (value.isTensor()) {
      out.setTensor(add_tensor(value.toTensor()));
    } else if (value.isIntList()) {
      auto list = value.toIntList();
      auto items = out.initIntList(list.size());
      for (size_t i = 0; i < list.size(); ++i) items.set(i, list.get(i));
    } else if (value.isDoubleList()) {
      auto list = value.toDoubleList();
      auto items = out.initDoubleList(list.size());
      for (size_t i = 0; i < list.size(); ++i) items.set(i, list.get(i));
    } else if (value.isBoolList()) {
      auto list = value.toBoolList();
      auto items = out.initBoolList(list.size());
      for (size_t i = 0; i < list.size(); ++i) items.set(i, list.get(i));
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      auto items = out.initTensorList(list.size());
      for (size_t i = 0; i < list.size(); ++i) items.set(i, add_tensor(list.get(i)));
    } else if (value.isList()) {
      auto list = value.toList();
      auto generic = out.initList();
      generic.setElementType(element_type_of(list.elementType()));
      auto items = generic.initItems(list.size());
      for (size_t i = 0; i < list.size(); ++i) encode(list.get(i), items[i], depth + 1);
    } else if (value.isTuple()) {
      const auto& elements = value.toTupleRef().elements();
      auto items = out.initTuple(elements.size());
      for (size_t i = 0; i < elements.size(); ++i) encode(elements[i], items[i], depth + 1);
    } else if (value.isGenericDict()) {
      auto dict = value.toGenericDict();
      auto wire_dict = out.initDict();
      wire_dict.setKeyType(element_type_of(dict.keyType()));
      wire_dict.setValueType(element_type_of(dict.valueType()));
      auto entries = wire_dict.initEntries(dict.size());
      size_t i = 0;
      for (const auto& entry : dict) {
        encode(entry.key(), entries[i].initKey(), depth + 1);
        encode(entry.value(), entries[i].initValue(), depth + 1);
        ++i;
      }
    } else if (value.isRRef()) {
      if (rrefs_ == nullptr) {
        throw Error(ErrorKind::InvalidArgument, "an RRef can only be sent through an agent");
      }
      RRefWire wire = rrefs_->fork_for_send(value.toRRef(), to_rank_);
      auto desc = out.initRref();
      desc.setOwner(wire.owner);
      desc.setIdRank(wire.id_rank);
      desc.setIdLocal(wire.id_local);
      desc.setForkRank(wire.fork_rank);
      desc.setForkLocal(wire.fork_local);
    } else {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("a value of type {} cannot be sent", value.tagKind()));
    }
  }

 private:
  std::uint32_t add_tensor(const at::Tensor& tensor) {
    requires_grad_->push_back(tensor.defined() && tensor.requires_grad());
    tensors_->push_back(sendable(tensor));
    return static_cast<std::uint32_t>(tensors_->size() - 1);
  }

  std::vector<at::Tensor>* tensors_;
  std::vector<bool>* requires_grad_;
  int max_depth_;
  RRefCodec* rrefs_;
  int to_rank_;
};

class ValueDecoder {
 public:
  ValueDecoder(const std::vector<at::Tensor>& tensors, int max_depth, RRefCodec* rrefs)
      : tensors_(tensors), max_depth_(max_depth), rrefs_(rrefs) {}

  c10::IValue decode(wire::Value::Reader in, int depth) {
    if (depth > max_depth_) {
      throw Error(ErrorKind::BadFrame,
                  fmt::format("value is nested deeper than the limit of {}", max_depth_));
    }
    switch (in.which()) {
      case wire::Value::NONE:
        return c10::IValue();
      case wire::Value::BOOL:
        return in.getBool();
      case wire::Value::INT:
        return static_cast<int64_t>(in.getInt());
      case wire::Value::DOUBLE:
        return in.getDouble();
      case wire::Value::STRING:
        return std::string(in.getString().cStr(), in.getString().size());
      case wire::Value::TENSOR:
        return tensor(in.getTensor());
      case wire::Value::INT_LIST: {
        c10::List<int64_t> list;
        for (auto v : in.getIntList()) list.push_back(v);
        return list;
      }
      case wire::Value::DOUBLE_LIST: {
        c10::List<double> list;
        for (auto v : in.getDoubleList()) list.push_back(v);
        return list;
      }
      case wire::Value::BOOL_LIST: {
        c10::List<bool> list;
        for (auto v : in.getBoolList()) list.push_back(v);
        return list;
      }
      case wire::Value::TENSOR_LIST: {
        c10::List<at::Tensor> list;
        for (auto index : in.getTensorList()) list.push_back(tensor(index));
        return list;
      }
      case wire::Value::LIST: {
        auto generic = in.getList();
        c10::impl::GenericList list(type_of(generic.getElementType()));
        for (auto item : generic.getItems())
          list.push_back(checked(decode(item, depth + 1), list.elementType()));
        return list;
      }
      case wire::Value::TUPLE: {
        std::vector<c10::IValue> elements;
        for (auto item : in.getTuple()) elements.push_back(decode(item, depth + 1));
        return c10::ivalue::Tuple::create(std::move(elements));
      }
      case wire::Value::DICT: {
        auto wire_dict = in.getDict();
        c10::impl::GenericDict dict(type_of(wire_dict.getKeyType()),
                                    type_of(wire_dict.getValueType()));
        for (auto entry : wire_dict.getEntries()) {
          c10::IValue key = checked(decode(entry.getKey(), depth + 1), dict.keyType());
          if (!key.isString() && !key.isInt() && !key.isDouble() && !key.isBool() &&
              !key.isTensor()) {
            throw Error(ErrorKind::BadFrame,
                        fmt::format("dict key of type {} is not hashable", key.tagKind()));
          }
          dict.insert_or_assign(std::move(key),
                                checked(decode(entry.getValue(), depth + 1), dict.valueType()));
        }
        return dict;
      }
      case wire::Value::RREF: {
        if (rrefs_ == nullptr) {
          throw Error(ErrorKind::BadFrame, "an RRef arrived where none can be received");
        }
        auto desc = in.getRref();
        RRefWire wire{desc.getOwner(), desc.getIdRank(), desc.getIdLocal(), desc.getForkRank(),
                      desc.getForkLocal()};
        return rrefs_->receive(wire);
      }
    }
    throw Error(ErrorKind::BadFrame,
                fmt::format("unknown value kind {}", static_cast<int>(in.which())));
  }

 private:
  at::Tensor tensor(std::uint32_t index) {
    if (index >= tensors_.size()) {
      throw Error(ErrorKind::BadFrame, fmt::format("tensor index {} is out of range ({} tensors)",
                                                   index, tensors_.size()));
    }
    return tensors_[index];
  }

  // A typed container must only hold values of its declared type.
  static c10::IValue checked(c10::IValue value, const c10::TypePtr& type) {
    if (type->kind() != c10::TypeKind::AnyType && !value.type()->isSubtypeOf(*type)) {
      throw Error(ErrorKind::BadFrame, fmt::format("container of {} holds a value of type {}",
                                                   type->str(), value.type()->str()));
    }
    return value;
  }

  const std::vector<at::Tensor>& tensors_;
  int max_depth_;
  RRefCodec* rrefs_;
};

wire::Kind to_wire(MessageKind kind) {
  switch (kind) {
    case MessageKind::Request:
      return wire::Kind::REQUEST;
    case MessageKind::Response:
      return wire::Kind::RESPONSE;
    case MessageKind::Error:
      return wire::Kind::ERROR;
    case MessageKind::Control:
      return wire::Kind::CONTROL;
  }
  return wire::Kind::CONTROL;
}

std::uint64_t read_u64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint32_t read_u32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

capnp::Data::Reader bytes(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

std::string from_bytes(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

}  // namespace

EncodedFrame encode_frame(const Message& message, int max_nesting_depth, RRefCodec* rrefs,
                          int to_rank) {
  EncodedFrame frame;
  std::vector<bool> requires_grad;
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  env.setVersion(kProtocolVersion);
  env.setId(message.id);
  env.setKind(to_wire(message.kind));
  env.setFunction(text(message.function));
  env.setGradContext(message.grad.context_id);
  env.setGradMessage(message.grad.message_id);
  ValueEncoder(&frame.tensors, &requires_grad, max_nesting_depth, rrefs, to_rank)
      .encode(message.value, env.initValue(), 0);
  if (message.kind == MessageKind::Error) {
    auto error = env.initError();
    error.setKind(static_cast<std::uint8_t>(message.error_kind));
    error.setMessage(text(message.error_message));
    error.setWorker(text(message.error_worker));
  }
  if (message.kind == MessageKind::Control) {
    auto hello = env.initHello();
    hello.setName(text(message.peer_name));
    hello.setRank(message.peer_rank);
    hello.setStep(static_cast<wire::HandshakeStep>(message.handshake.step));
    hello.setChallenge(bytes(message.handshake.challenge));
    hello.setNonce(bytes(message.handshake.nonce));
    hello.setProof(bytes(message.handshake.proof));
  }
  auto descs = env.initTensors(frame.tensors.size());
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    const at::Tensor& t = frame.tensors[i];
    auto desc = descs[i];
    if (!t.defined()) {
      desc.setUndefined(true);
      continue;
    }
    desc.setDtype(to_wire(t.scalar_type()));
    auto shape = desc.initShape(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) shape.set(d, t.size(d));
    std::uint64_t bytes = t.numel() * t.element_size();
    desc.setByteLength(bytes);
    desc.setRequiresGrad(requires_grad[i]);
    desc.setDevice("cpu");
    frame.payload_bytes += bytes;
  }

  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  frame.head.resize(kFrameHeaderBytes + bytes.size());
  std::uint32_t magic = kFrameMagic;
  std::uint32_t envelope_bytes = static_cast<std::uint32_t>(bytes.size());
  std::memcpy(frame.head.data(), &magic, 4);
  std::memcpy(frame.head.data() + 4, &envelope_bytes, 4);
  std::memcpy(frame.head.data() + 8, &frame.payload_bytes, 8);
  std::memcpy(frame.head.data() + kFrameHeaderBytes, bytes.begin(), bytes.size());
  return frame;
}

std::pair<char*, std::size_t> FrameDecoder::direct_target() const {
  if (state_ != State::Payload) return {nullptr, 0};
  const at::Tensor& t = tensors_[tensor_index_];
  char* base = static_cast<char*>(t.data_ptr());
  return {base + tensor_offset_, t.nbytes() - tensor_offset_};
}

void FrameDecoder::commit_direct(std::size_t n, std::vector<Message>* out) {
  advance_payload(n, out);
}

void FrameDecoder::consume(const char* data, std::size_t n, std::vector<Message>* out) {
  while (n > 0) {
    switch (state_) {
      case State::Header: {
        std::size_t take = std::min(n, kFrameHeaderBytes - filled_);
        std::memcpy(header_ + filled_, data, take);
        filled_ += take;
        data += take;
        n -= take;
        if (filled_ == kFrameHeaderBytes) finish_header();
        break;
      }
      case State::Envelope: {
        std::size_t take = std::min<std::size_t>(n, envelope_bytes_ - filled_);
        std::memcpy(reinterpret_cast<char*>(envelope_.data()) + filled_, data, take);
        filled_ += take;
        data += take;
        n -= take;
        if (filled_ == envelope_bytes_) finish_envelope(out);
        break;
      }
      case State::Payload: {
        auto [target, missing] = direct_target();
        std::size_t take = std::min(n, missing);
        std::memcpy(target, data, take);
        copied_payload_bytes_ += take;
        data += take;
        n -= take;
        advance_payload(take, out);
        break;
      }
    }
  }
}

void FrameDecoder::finish_header() {
  std::uint32_t magic = read_u32(header_);
  envelope_bytes_ = read_u32(header_ + 4);
  payload_bytes_ = read_u64(header_ + 8);
  if (magic != kFrameMagic) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("bad magic 0x{:08x} (expected 0x{:08x})", magic, kFrameMagic));
  }
  if (envelope_bytes_ == 0 || envelope_bytes_ % 8 != 0) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("envelope length {} is not a positive multiple of 8", envelope_bytes_));
  }
  if (envelope_bytes_ > limits_.max_frame_bytes ||
      payload_bytes_ > limits_.max_frame_bytes - envelope_bytes_) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("frame of {} envelope bytes and {} payload bytes exceeds the limit of "
                            "{} bytes",
                            envelope_bytes_, payload_bytes_, limits_.max_frame_bytes));
  }
  envelope_.assign(envelope_bytes_ / 8, 0);
  filled_ = 0;
  state_ = State::Envelope;
}

void FrameDecoder::finish_envelope(std::vector<Message>* out) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = envelope_.size() * 4 + 1024;
  options.nestingLimit = limits_.max_nesting_depth * 4 + 16;
  Message message;
  tensors_.clear();
  try {
    kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(envelope_.data()),
                                          envelope_.size());
    capnp::FlatArrayMessageReader reader(words, options);
    auto env = reader.getRoot<wire::Envelope>();
    if (env.getVersion() != kProtocolVersion) {
      throw Error(ErrorKind::BadFrame, fmt::format("protocol version {} (this build speaks {})",
                                                   env.getVersion(), kProtocolVersion));
    }
    message.id = env.getId();
    message.function = env.getFunction().cStr();
    message.grad.context_id = env.getGradContext();
    message.grad.message_id = env.getGradMessage();
    switch (env.getKind()) {
      case wire::Kind::REQUEST:
        message.kind = MessageKind::Request;
        break;
      case wire::Kind::RESPONSE:
        message.kind = MessageKind::Response;
        break;
      case wire::Kind::ERROR:
        message.kind = MessageKind::Error;
        break;
      case wire::Kind::CONTROL:
        message.kind = MessageKind::Control;
        break;
      default:
        throw Error(ErrorKind::BadFrame,
                    fmt::format("unknown message kind {}", static_cast<int>(env.getKind())));
    }

    std::uint64_t total = 0;
    for (auto desc : env.getTensors()) {
      if (desc.getUndefined()) {
        tensors_.emplace_back();
        continue;
      }
      at::ScalarType dtype;
      if (!from_wire(desc.getDtype(), &dtype)) {
        throw Error(ErrorKind::BadFrame,
                    fmt::format("tensor {} has unknown dtype {}", tensors_.size(),
                                static_cast<int>(desc.getDtype())));
      }
      std::vector<int64_t> shape;
      std::uint64_t numel = 1;
      for (int64_t dim : desc.getShape()) {
        if (dim < 0) {
          throw Error(ErrorKind::BadFrame,
                      fmt::format("tensor {} has negative dimension {}", tensors_.size(), dim));
        }
        if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim) {
          throw Error(ErrorKind::BadFrame,
                      fmt::format("tensor {} has a shape whose size overflows", tensors_.size()));
        }
        numel *= static_cast<std::uint64_t>(dim);
        shape.push_back(dim);
      }
      std::uint64_t item = c10::elementSize(dtype);
      if (numel > limits_.max_frame_bytes / item || numel * item != desc.getByteLength()) {
        throw Error(ErrorKind::BadFrame,
                    fmt::format("tensor {} of shape {} and dtype {} declares {} bytes",
                                tensors_.size(), c10::str(c10::IntArrayRef(shape)),
                                c10::toString(dtype), desc.getByteLength()));
      }
      total += desc.getByteLength();
      if (total > payload_bytes_) break;
      at::Tensor t = empty_cached(shape, dtype);
      tensors_.push_back(std::move(t));
    }
    if (total != payload_bytes_) {
      throw Error(ErrorKind::BadFrame,
                  fmt::format("tensors declare {} bytes but the header announces {}", total,
                              payload_bytes_));
    }
    message.value =
        ValueDecoder(tensors_, limits_.max_nesting_depth, rrefs_).decode(env.getValue(), 0);
    if (message.kind == MessageKind::Error) {
      auto error = env.getError();
      if (error.getKind() > static_cast<std::uint8_t>(ErrorKind::Shutdown)) {
        throw Error(ErrorKind::BadFrame,
                    fmt::format("unknown error kind {}", static_cast<int>(error.getKind())));
      }
      message.error_kind = static_cast<ErrorKind>(error.getKind());
      message.error_message = error.getMessage().cStr();
      message.error_worker = error.getWorker().cStr();
    }
    if (message.kind == MessageKind::Control) {
      auto hello = env.getHello();
      message.peer_name = hello.getName().cStr();
      message.peer_rank = hello.getRank();
      auto step = static_cast<std::uint16_t>(hello.getStep());
      if (step > static_cast<std::uint16_t>(HandshakeStep::Welcome)) {
        throw Error(ErrorKind::BadFrame, fmt::format("unknown handshake step {}", step));
      }
      message.handshake.step = static_cast<HandshakeStep>(step);
      message.handshake.challenge = from_bytes(hello.getChallenge());
      message.handshake.nonce = from_bytes(hello.getNonce());
      message.handshake.proof = from_bytes(hello.getProof());
    }
    size_t i = 0;
    for (auto desc : env.getTensors()) {
      if (desc.getRequiresGrad() && tensors_[i].defined()) {
        if (!at::isFloatingType(tensors_[i].scalar_type()) &&
            !at::isComplexType(tensors_[i].scalar_type())) {
          throw Error(ErrorKind::BadFrame,
                      fmt::format("tensor {} requires grad but has dtype {}", i,
                                  c10::toString(tensors_[i].scalar_type())));
        }
        tensors_[i].set_requires_grad(true);
      }
      ++i;
    }
  } catch (const Error&) {
    throw;
  } catch (const kj::Exception& e) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("malformed envelope: {}", e.getDescription().cStr()));
  } catch (const c10::Error& e) {
    // LibTorch's own checks of a value a well-formed envelope can still describe (an undefined
    // tensor in a typed list, found by fuzzing): the peer's fault, not this process's.
    throw Error(ErrorKind::BadFrame,
                fmt::format("malformed value: {}", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::BadFrame, fmt::format("malformed value: {}", e.what()));
  }
  pending_ = std::move(message);
  state_ = State::Payload;
  tensor_index_ = 0;
  tensor_offset_ = 0;
  skip_empty_tensors(out);
}

void FrameDecoder::advance_payload(std::size_t n, std::vector<Message>* out) {
  tensor_offset_ += n;
  skip_empty_tensors(out);
}

// Moves past tensors whose bytes are complete (or that have none); emits the message at the end.
void FrameDecoder::skip_empty_tensors(std::vector<Message>* out) {
  while (tensor_index_ < tensors_.size()) {
    const at::Tensor& t = tensors_[tensor_index_];
    if (t.defined() && tensor_offset_ < t.nbytes()) return;
    ++tensor_index_;
    tensor_offset_ = 0;
  }
  out->push_back(std::move(pending_));
  pending_ = Message();
  tensors_.clear();
  state_ = State::Header;
  filled_ = 0;
}

}  // namespace ferry::rpc
