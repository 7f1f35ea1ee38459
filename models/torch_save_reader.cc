#include "models/torch_save_reader.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace ferry::models {
namespace {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// A Python object as far as a state dict needs one.
struct Value {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Tensor, Object, Mark };
  Kind kind = Kind::None;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // a string, or "module.name" of a global or of what built an object
  std::vector<ValuePtr> items;
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  at::Tensor tensor;
};

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

[[noreturn]] void malformed(const std::string& what) {
  throw std::runtime_error("malformed pickle: " + what);
}

c10::ScalarType dtype_of_storage(const std::string& global) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat},      {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},        {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},        {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},      {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},        {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  auto it = types.find(global);
  if (it == types.end()) malformed("unknown storage type " + global);
  return it->second;
}

std::vector<int64_t> ints_of(const Value& tuple, const char* what) {
  std::vector<int64_t> out;
  for (const auto& item : tuple.items) {
    if (item->kind != Value::Kind::Int) malformed(fmt::format("{} holds a non-integer", what));
    out.push_back(item->integer);
  }
  return out;
}

class Unpickler {
 public:
  Unpickler(caffe2::serialize::PyTorchStreamReader& archive, const char* data, size_t size)
      : archive_(archive), data_(data), size_(size) {}

  ValuePtr run() {
    for (;;) {
      uint8_t op = byte();
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1) malformed("the stack does not end with one value");
    return stack_.back();
  }

 private:
  const char* take(size_t n) {
    if (n > size_ - pos_) malformed("it ends in the middle of an opcode");
    const char* at = data_ + pos_;
    pos_ += n;
    return at;
  }
  uint8_t byte() { return static_cast<uint8_t>(*take(1)); }
  template <typename T>
  T little() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string line() {
    const char* start = data_ + pos_;
    const void* end = std::memchr(start, '\n', size_ - pos_);
    if (!end) malformed("a line without its end");
    size_t n = static_cast<const char*>(end) - start;
    pos_ += n + 1;
    return std::string(start, n);
  }
  ValuePtr pop() {
    if (stack_.empty()) malformed("pop from an empty stack");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.empty()) malformed("an opcode needs a value on an empty stack");
    return stack_.back();
  }
  // Everything above the topmost mark, which is removed.
  std::vector<ValuePtr> pop_to_mark() {
    size_t k = stack_.size();
    while (k > 0 && stack_[k - 1]->kind != Value::Kind::Mark) --k;
    if (k == 0) malformed("no mark on the stack");
    std::vector<ValuePtr> items(stack_.begin() + k, stack_.end());
    stack_.resize(k - 1);
    return items;
  }
  void push_string(size_t n) {
    auto v = make(Value::Kind::String);
    v->text.assign(take(n), n);
    stack_.push_back(v);
  }
  void push_int(int64_t i) {
    auto v = make(Value::Kind::Int);
    v->integer = i;
    stack_.push_back(v);
  }
  void push_tuple(std::vector<ValuePtr> items) {
    auto v = make(Value::Kind::Tuple);
    v->items = std::move(items);
    stack_.push_back(v);
  }
  void push_global(const std::string& module, const std::string& name) {
    auto v = make(Value::Kind::Global);
    v->text = module + "." + name;
    stack_.push_back(v);
  }
  void memo_put(size_t index) { memo_[index] = top(); }
  void memo_get(size_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) malformed(fmt::format("memo {} used before it was set", index));
    stack_.push_back(it->second);
  }
  void set_items(Value& dict, const std::vector<ValuePtr>& flat) {
    if (dict.kind != Value::Kind::Dict) malformed("items set on something that is not a dict");
    if (flat.size() % 2) malformed("a dict item without its value");
    for (size_t i = 0; i < flat.size(); i += 2) dict.entries.emplace_back(flat[i], flat[i + 1]);
  }
  void append_items(Value& list, const std::vector<ValuePtr>& items) {
    if (list.kind != Value::Kind::List) malformed("items appended to something that is not a list");
    list.items.insert(list.items.end(), items.begin(), items.end());
  }

  // ('storage', <storage type>, key, location, numel): the record data/<key>, as a flat tensor.
  ValuePtr storage(const Value& id) {
    if (id.kind != Value::Kind::Tuple || id.items.size() < 5 ||
        id.items[0]->kind != Value::Kind::String || id.items[0]->text != "storage" ||
        id.items[1]->kind != Value::Kind::Global || id.items[2]->kind != Value::Kind::String) {
      malformed("a persistent id that is not a storage");
    }
    const std::string& key = id.items[2]->text;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    c10::ScalarType dtype = dtype_of_storage(id.items[1]->text);
    std::string record = "data/" + key;
    if (!archive_.hasRecord(record)) malformed("no record " + record + " in the archive");
    auto [data, bytes] = archive_.getRecord(record);
    int64_t numel = static_cast<int64_t>(bytes / c10::elementSize(dtype));
    auto v = make(Value::Kind::Tensor);
    v->tensor = at::empty({numel}, at::TensorOptions().dtype(dtype));
    std::memcpy(v->tensor.data_ptr(), data.get(), numel * c10::elementSize(dtype));
    storages_[key] = v;
    return v;
  }

  ValuePtr reduce(const Value& callable, const Value& args) {
    const std::string& name = callable.text;
    if (name == "collections.OrderedDict") return make(Value::Kind::Dict);
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      if (args.items.size() < 4 || args.items[0]->kind != Value::Kind::Tensor ||
          args.items[1]->kind != Value::Kind::Int) {
        malformed("arguments of " + name);
      }
      const at::Tensor& flat = args.items[0]->tensor;
      std::vector<int64_t> sizes = ints_of(*args.items[2], "a tensor's size");
      std::vector<int64_t> strides = ints_of(*args.items[3], "a tensor's stride");
      if (sizes.size() != strides.size()) malformed("a tensor's size and stride differ in length");
      int64_t offset = args.items[1]->integer;
      int64_t last = offset;
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] < 0 || strides[d] < 0) malformed("a negative size or stride");
        if (sizes[d] == 0) last = -1;
        if (last >= 0) last += (sizes[d] - 1) * strides[d];
      }
      if (offset < 0 || last >= flat.numel()) malformed("a tensor reaches past its storage");
      auto v = make(Value::Kind::Tensor);
      v->tensor = flat.as_strided(sizes, strides, offset);
      return v;
    }
    if (name == "torch._utils._rebuild_parameter" && !args.items.empty() &&
        args.items[0]->kind == Value::Kind::Tensor) {
      return args.items[0];
    }
    // C++'s pickler wraps a typed dict or list with its type; the value is all that matters here.
    if (name == "torch.jit._pickle.restore_type_tag" && !args.items.empty()) return args.items[0];
    auto v = make(Value::Kind::Object);
    v->text = name;
    return v;
  }

  void step(uint8_t op) {
    if (!step_scalar(op) && !step_structure(op)) {
      malformed(fmt::format("opcode 0x{:02x} at byte {} is not supported", op, pos_ - 1));
    }
  }

  // Protocol marks and scalars: booleans, integers, floats, strings. False for other opcodes.
  bool step_scalar(uint8_t op) {
    switch (op) {
      case 0x80: byte(); break;         // PROTO
      case 0x95: take(8); break;        // FRAME
      case '(': stack_.push_back(make(Value::Kind::Mark)); break;
      case 'N': stack_.push_back(make(Value::Kind::None)); break;
      case 0x88: case 0x89: {           // NEWTRUE, NEWFALSE
        auto v = make(Value::Kind::Bool);
        v->integer = op == 0x88;
        stack_.push_back(v);
        break;
      }
      case 'K': push_int(byte()); break;
      case 'M': push_int(little<uint16_t>()); break;
      case 'J': push_int(little<int32_t>()); break;
      case 0x8a: {                      // LONG1
        size_t n = byte();
        if (n > 8) malformed("an integer wider than 64 bits");
        const char* p = take(n);
        uint64_t u = 0;
        for (size_t i = 0; i < n; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
        if (n > 0 && n < 8 && (static_cast<uint8_t>(p[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n);
        push_int(static_cast<int64_t>(u));
        break;
      }
      case 'G': {                       // BINFLOAT, big-endian
        const char* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p[i]);
        auto v = make(Value::Kind::Float);
        std::memcpy(&v->real, &bits, sizeof bits);
        stack_.push_back(v);
        break;
      }
      case 'X': push_string(little<uint32_t>()); break;  // BINUNICODE
      case 0x8c: push_string(byte()); break;             // SHORT_BINUNICODE
      case 0x8d: push_string(little<uint64_t>()); break; // BINUNICODE8
      case 'T': push_string(little<uint32_t>()); break;  // BINSTRING
      case 'U': push_string(byte()); break;              // SHORT_BINSTRING
      default: return false;
    }
    return true;
  }

  // Globals, tuples, lists, dicts, the memo, storages and object construction. False for other
  // opcodes.
  bool step_structure(uint8_t op) {
    switch (op) {
      case 'c': {                       // GLOBAL
        std::string module = line();
        push_global(module, line());
        break;
      }
      case 0x93: {                      // STACK_GLOBAL
        ValuePtr name = pop(), module = pop();
        push_global(module->text, name->text);
        break;
      }
      case ')': push_tuple({}); break;
      case 0x85: { auto a = pop(); push_tuple({a}); break; }
      case 0x86: { auto b = pop(), a = pop(); push_tuple({a, b}); break; }
      case 0x87: { auto c = pop(), b = pop(), a = pop(); push_tuple({a, b, c}); break; }
      case 't': push_tuple(pop_to_mark()); break;
      case ']': stack_.push_back(make(Value::Kind::List)); break;
      case 'l': { auto v = make(Value::Kind::List); v->items = pop_to_mark(); stack_.push_back(v); break; }
      case '}': stack_.push_back(make(Value::Kind::Dict)); break;
      case 'd': { auto v = make(Value::Kind::Dict); set_items(*v, pop_to_mark()); stack_.push_back(v); break; }
      case 'a': { auto item = pop(); append_items(*top(), {item}); break; }
      case 'e': { auto items = pop_to_mark(); append_items(*top(), items); break; }
      case 's': { auto value = pop(), key = pop(); set_items(*top(), {key, value}); break; }
      case 'u': { auto flat = pop_to_mark(); set_items(*top(), flat); break; }
      case 'q': memo_put(byte()); break;
      case 'r': memo_put(little<uint32_t>()); break;
      case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
      case 'h': memo_get(byte()); break;
      case 'j': memo_get(little<uint32_t>()); break;
      case 'Q': { auto id = pop(); stack_.push_back(storage(*id)); break; }  // BINPERSID
      case 'R': {                       // REDUCE
        ValuePtr args = pop(), callable = pop();
        if (callable->kind != Value::Kind::Global || args->kind != Value::Kind::Tuple) {
          malformed("REDUCE without a global and its arguments");
        }
        stack_.push_back(reduce(*callable, *args));
        break;
      }
      case 0x81: {                      // NEWOBJ
        pop();
        ValuePtr cls = pop();
        auto v = make(Value::Kind::Object);
        v->text = cls->text;
        stack_.push_back(v);
        break;
      }
      case 'b': pop(); break;           // BUILD: attributes (a state dict's _metadata) are not needed
      case '0': pop(); break;           // POP
      case '1': pop_to_mark(); break;   // POP_MARK
      case '2': stack_.push_back(top()); break;  // DUP
      default: return false;
    }
    return true;
  }

  caffe2::serialize::PyTorchStreamReader& archive_;
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::unordered_map<size_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::Tuple: return "tuple";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    default: return "object";
  }
}

std::string describe(const Value& v) {
  if (v.kind == Value::Kind::Object) return "an object made by " + v.text;
  return std::string("a ") + kind_name(v.kind);
}

}  // namespace

std::map<std::string, at::Tensor> read_torch_save(caffe2::serialize::PyTorchStreamReader& archive) {
  if (!archive.hasRecord("data.pkl")) throw std::runtime_error("no data.pkl in the archive");
  auto [pickle, size] = archive.getRecord("data.pkl");
  ValuePtr root = Unpickler(archive, static_cast<const char*>(pickle.get()), size).run();
  for (const auto& [key, value] : root->entries) {
    if (key->kind == Value::Kind::String && key->text == "state_dict" &&
        value->kind == Value::Kind::Dict) {
      root = value;
      break;
    }
  }
  if (root->kind != Value::Kind::Dict) {
    throw std::runtime_error(fmt::format("it holds {}, not a dict of tensors", describe(*root)));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != Value::Kind::String) throw std::runtime_error("a key of its dict is not a string");
    if (value->kind != Value::Kind::Tensor) {
      throw std::runtime_error(fmt::format("\"{}\" is {}, not a tensor", key->text,
                                           describe(*value)));
    }
    out[key->text] = value->tensor;
  }
  return out;
}

}  // namespace ferry::models
