// The values of messages on the wire: IValues into and out of the envelope's wire::Value, each
// tensor's bytes left for the frame to carry beside it.
#include "rpc/value_codec.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "ferry/rpc/error.h"

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

}  // namespace

wire::DType dtype_to_wire(at::ScalarType type) {
  for (const auto& entry : kDTypes) {
    if (entry.scalar == type) return entry.wire;
  }
  throw Error(ErrorKind::InvalidArgument,
              fmt::format("tensors of dtype {} cannot be sent", c10::toString(type)));
}

bool dtype_from_wire(wire::DType type, at::ScalarType* out) {
  for (const auto& entry : kDTypes) {
    if (entry.wire == type) {
      *out = entry.scalar;
      return true;
    }
  }
  return false;
}

namespace {

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

}  // namespace

void encode_value(const c10::IValue& value, wire::Value::Builder out, int max_depth,
                  RRefCodec* rrefs, int to_rank, std::vector<at::Tensor>* tensors,
                  std::vector<bool>* requires_grad) {
  ValueEncoder(tensors, requires_grad, max_depth, rrefs, to_rank).encode(value, out, 0);
}

c10::IValue decode_value(wire::Value::Reader in, const std::vector<at::Tensor>& tensors,
                         int max_depth, RRefCodec* rrefs) {
  return ValueDecoder(tensors, max_depth, rrefs).decode(in, 0);
}

}  // namespace ferry::rpc
