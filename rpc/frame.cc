// Encoding runs on the calling thread; decoding on the connection's reading thread (the loop).
#include "rpc/frame.h"

#include <ATen/ATen.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstring>
#include <limits>

#include "ferry/core/tensor_cache.h"
#include "rpc/value_codec.h"
#include "rpc/wire.capnp.h"
#include "rpc/wire_hello.h"

namespace ferry::rpc {
namespace {

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
  env.setFunction(wire_text(message.function));
  env.setGradContext(message.grad.context_id);
  env.setGradMessage(message.grad.message_id);
  encode_value(message.value, env.initValue(), max_nesting_depth, rrefs, to_rank, &frame.tensors,
               &requires_grad);
  if (message.kind == MessageKind::Error) {
    auto error = env.initError();
    error.setKind(static_cast<std::uint8_t>(message.error_kind));
    error.setMessage(wire_text(message.error_message));
    error.setWorker(wire_text(message.error_worker));
  }
  if (message.kind == MessageKind::Control) {
    write_hello(env.initHello(), message.peer_name, message.peer_rank, message.handshake);
  }
  auto descs = env.initTensors(frame.tensors.size());
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    const at::Tensor& t = frame.tensors[i];
    auto desc = descs[i];
    if (!t.defined()) {
      desc.setUndefined(true);
      continue;
    }
    desc.setDtype(dtype_to_wire(t.scalar_type()));
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

namespace {

using TensorDescs = capnp::List<wire::TensorDesc>::Reader;

MessageKind kind_from_wire(wire::Kind kind) {
  switch (kind) {
    case wire::Kind::REQUEST:
      return MessageKind::Request;
    case wire::Kind::RESPONSE:
      return MessageKind::Response;
    case wire::Kind::ERROR:
      return MessageKind::Error;
    case wire::Kind::CONTROL:
      return MessageKind::Control;
  }
  throw Error(ErrorKind::BadFrame, fmt::format("unknown message kind {}", static_cast<int>(kind)));
}

// One empty tensor per description, to be filled from the payload: each shape's size must match
// its byte length, and all of them the payload the header announced.
std::vector<at::Tensor> allocate_tensors(TensorDescs descs, const FrameLimits& limits,
                                         std::uint64_t payload_bytes) {
  std::vector<at::Tensor> tensors;
  std::uint64_t total = 0;
  for (auto desc : descs) {
    if (desc.getUndefined()) {
      tensors.emplace_back();
      continue;
    }
    at::ScalarType dtype;
    if (!dtype_from_wire(desc.getDtype(), &dtype)) {
      throw Error(ErrorKind::BadFrame, fmt::format("tensor {} has unknown dtype {}", tensors.size(),
                                                   static_cast<int>(desc.getDtype())));
    }
    std::vector<int64_t> shape;
    std::uint64_t numel = 1;
    for (int64_t dim : desc.getShape()) {
      if (dim < 0) {
        throw Error(ErrorKind::BadFrame,
                    fmt::format("tensor {} has negative dimension {}", tensors.size(), dim));
      }
      if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim) {
        throw Error(ErrorKind::BadFrame,
                    fmt::format("tensor {} has a shape whose size overflows", tensors.size()));
      }
      numel *= static_cast<std::uint64_t>(dim);
      shape.push_back(dim);
    }
    std::uint64_t item = c10::elementSize(dtype);
    if (numel > limits.max_frame_bytes / item || numel * item != desc.getByteLength()) {
      throw Error(ErrorKind::BadFrame,
                  fmt::format("tensor {} of shape {} and dtype {} declares {} bytes",
                              tensors.size(), c10::str(c10::IntArrayRef(shape)),
                              c10::toString(dtype), desc.getByteLength()));
    }
    total += desc.getByteLength();
    if (total > payload_bytes) break;
    tensors.push_back(core::empty_cached(shape, dtype));
  }
  if (total != payload_bytes) {
    throw Error(
        ErrorKind::BadFrame,
        fmt::format("tensors declare {} bytes but the header announces {}", total, payload_bytes));
  }
  return tensors;
}

void read_error(wire::ErrorInfo::Reader error, Message& message) {
  if (error.getKind() > static_cast<std::uint8_t>(ErrorKind::OutOfMemory)) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("unknown error kind {}", static_cast<int>(error.getKind())));
  }
  message.error_kind = static_cast<ErrorKind>(error.getKind());
  message.error_message = error.getMessage().cStr();
  message.error_worker = error.getWorker().cStr();
}

// Only floating-point and complex tensors can require grad.
void mark_requires_grad(TensorDescs descs, std::vector<at::Tensor>& tensors) {
  size_t i = 0;
  for (auto desc : descs) {
    if (desc.getRequiresGrad() && tensors[i].defined()) {
      if (!at::isFloatingType(tensors[i].scalar_type()) &&
          !at::isComplexType(tensors[i].scalar_type())) {
        throw Error(ErrorKind::BadFrame, fmt::format("tensor {} requires grad but has dtype {}", i,
                                                     c10::toString(tensors[i].scalar_type())));
      }
      tensors[i].set_requires_grad(true);
    }
    ++i;
  }
}

}  // namespace

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
    message.kind = kind_from_wire(env.getKind());
    tensors_ = allocate_tensors(env.getTensors(), limits_, payload_bytes_);
    message.value = decode_value(env.getValue(), tensors_, limits_.max_nesting_depth, rrefs_);
    if (message.kind == MessageKind::Error) read_error(env.getError(), message);
    if (message.kind == MessageKind::Control)
      read_hello(env.getHello(), &message.peer_name, &message.peer_rank, &message.handshake);
    mark_requires_grad(env.getTensors(), tensors_);
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
