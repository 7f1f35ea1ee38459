#include "rpc/frame.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "rpc/wire.capnp.h"
#include "tests/support/error_of.h"

namespace ferry::rpc {
namespace {

using ferry::testing::kind_and_error_of;
using ::testing::HasSubstr;

// Feeds a frame to a decoder the way the transport does: through a small buffer, and straight
// into tensor memory whenever the decoder offers it.
std::vector<Message> decode_like_transport(const EncodedFrame& frame, size_t chunk,
                                           FrameDecoder* decoder) {
  std::string bytes(frame.head.begin(), frame.head.end());
  for (const auto& t : frame.tensors) {
    if (t.defined()) bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  std::vector<Message> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    auto [target, missing] = decoder->direct_target();
    if (target != nullptr && missing >= chunk) {
      std::memcpy(target, bytes.data() + pos, missing);
      pos += missing;
      decoder->commit_direct(missing, &out);
      continue;
    }
    size_t n = std::min(chunk, bytes.size() - pos);
    decoder->consume(bytes.data() + pos, n, &out);
    pos += n;
  }
  return out;
}

c10::IValue round_trip(const c10::IValue& value, size_t chunk = 7) {
  Message m;
  m.kind = MessageKind::Response;
  m.id = 42;
  m.value = value;
  EncodedFrame frame = encode_frame(m);
  FrameDecoder decoder(FrameLimits{});
  auto out = decode_like_transport(frame, chunk, &decoder);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out.at(0).id, 42u);
  EXPECT_EQ(out.at(0).kind, MessageKind::Response);
  return out.at(0).value;
}

void expect_same_tensor(const at::Tensor& expected, const at::Tensor& actual) {
  ASSERT_TRUE(actual.defined());
  EXPECT_EQ(expected.scalar_type(), actual.scalar_type());
  EXPECT_EQ(expected.sizes(), actual.sizes());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_TRUE(torch::equal(expected.contiguous(), actual));
}

TEST(Frame, RoundTripsScalars) {
  EXPECT_TRUE(round_trip(c10::IValue()).isNone());
  EXPECT_EQ(round_trip(true).toBool(), true);
  EXPECT_EQ(round_trip(int64_t{-1234567890123}).toInt(), -1234567890123);
  EXPECT_EQ(round_trip(3.25).toDouble(), 3.25);
  EXPECT_EQ(round_trip(std::string("stage \"decoder\"\n")).toStringRef(), "stage \"decoder\"\n");
  EXPECT_EQ(round_trip(std::string()).toStringRef(), "");
}

class FrameDtype : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(FrameDtype, RoundTripsTensorsOfEveryShape) {
  at::ScalarType dtype = GetParam();
  auto opts = torch::TensorOptions().dtype(dtype);
  std::vector<at::Tensor> cases = {
      torch::arange(0, 24).reshape({2, 3, 4}).to(opts),  // ordinary
      torch::tensor(5).to(opts),                         // 0-dim
      torch::empty({0}, opts),                           // empty
      torch::empty({3, 0, 2}, opts),                     // empty with shape
      torch::arange(0, 5000).to(opts),                   // large enough for a direct read
  };
  // Both halves of every complex number, not just the real parts arange gives.
  if (at::isComplexType(dtype)) cases.push_back(torch::randn({7, 3}, opts));
  for (const auto& t : cases) {
    expect_same_tensor(t, round_trip(t, 64).toTensor());
    expect_same_tensor(t, round_trip(t, 1).toTensor());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FrameDtype,
                         ::testing::Values(at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                           at::kChar, at::kShort, at::kInt, at::kLong, at::kByte,
                                           at::kBool, at::kComplexFloat, at::kComplexDouble),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(Frame, NonContiguousTensorArrivesContiguousWithTheSameValues) {
  at::Tensor base = torch::randn({64, 32});
  at::Tensor transposed = base.t();
  ASSERT_FALSE(transposed.is_contiguous());
  expect_same_tensor(transposed, round_trip(transposed).toTensor());
  at::Tensor strided = base.index({torch::indexing::Slice(), torch::indexing::Slice(0, 32, 3)});
  expect_same_tensor(strided, round_trip(strided).toTensor());
}

TEST(Frame, SliceOfALargeTensorSendsOnlyItsOwnBytes) {
  at::Tensor large = torch::randn({1 << 20});  // 4 MiB of storage
  at::Tensor slice = large.slice(0, 1000, 1010);
  Message m;
  m.kind = MessageKind::Request;
  m.value = slice;
  EncodedFrame frame = encode_frame(m);
  EXPECT_EQ(frame.payload_bytes, 10 * sizeof(float));
  ASSERT_EQ(frame.tensors.size(), 1u);
  // Sent straight from the view's memory, not from a copy.
  EXPECT_EQ(frame.tensors[0].data_ptr(), slice.data_ptr());
  EXPECT_LT(frame.size(), 1024u);
  expect_same_tensor(slice, round_trip(slice).toTensor());
}

TEST(Frame, LargeTensorIsReadStraightIntoItsMemory) {
  at::Tensor big = torch::randn({1 << 18});
  Message m;
  m.value = big;
  EncodedFrame frame = encode_frame(m);
  FrameDecoder decoder(FrameLimits{});
  auto out = decode_like_transport(frame, 4096, &decoder);
  ASSERT_EQ(out.size(), 1u);
  expect_same_tensor(big, out[0].value.toTensor());
  // Only bytes that shared a buffered read with the envelope are copied; the rest land in place.
  EXPECT_LT(decoder.copied_payload_bytes(), 4096u);
}

TEST(Frame, RoundTripsContainersWithTheirTypes) {
  c10::List<int64_t> ints({1, -2, 3});
  c10::List<double> doubles({0.5, -1.5});
  c10::List<bool> bools({true, false, true});
  c10::List<at::Tensor> tensors({torch::ones({2}), torch::zeros({3})});
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("weight", torch::randn({3, 3}));
  dict.insert("bias", torch::randn({3}));
  c10::impl::GenericList nested(c10::AnyType::get());
  nested.push_back(c10::IValue(int64_t{7}));
  nested.push_back(
      c10::ivalue::Tuple::create({c10::IValue(std::string("x")), c10::IValue(torch::ones({1}))}));
  auto tuple = c10::ivalue::Tuple::create({c10::IValue(ints), c10::IValue(doubles),
                                           c10::IValue(bools), c10::IValue(tensors),
                                           c10::IValue(dict), c10::IValue(nested), c10::IValue()});

  c10::IValue back = round_trip(tuple);
  const auto& e = back.toTupleRef().elements();
  ASSERT_EQ(e.size(), 7u);
  EXPECT_EQ(e[0].toIntVector(), std::vector<int64_t>({1, -2, 3}));
  EXPECT_EQ(e[1].toDoubleVector(), std::vector<double>({0.5, -1.5}));
  EXPECT_EQ(e[2].toBoolList().vec(), std::vector<bool>({true, false, true}));
  ASSERT_EQ(e[3].toTensorVector().size(), 2u);
  expect_same_tensor(torch::zeros({3}), e[3].toTensorVector()[1]);
  auto typed = e[4].to<c10::Dict<std::string, at::Tensor>>();
  expect_same_tensor(dict.at("weight"), typed.at("weight"));
  expect_same_tensor(dict.at("bias"), typed.at("bias"));
  auto list = e[5].toList();
  EXPECT_EQ(list.get(0).toInt(), 7);
  EXPECT_EQ(list.get(1).toTupleRef().elements()[0].toStringRef(), "x");
  EXPECT_TRUE(e[6].isNone());
}

TEST(Frame, RequiresGradAndUndefinedTensorsSurvive) {
  at::Tensor w = torch::randn({4}, torch::requires_grad());
  auto back = round_trip(c10::ivalue::Tuple::create({c10::IValue(w), c10::IValue(at::Tensor())}));
  const auto& e = back.toTupleRef().elements();
  EXPECT_TRUE(e[0].toTensor().requires_grad());
  EXPECT_TRUE(torch::equal(w.detach(), e[0].toTensor().detach()));
  EXPECT_FALSE(e[1].toTensor().defined());
}

TEST(Frame, ErrorAndHelloFieldsRoundTrip) {
  Message m;
  m.kind = MessageKind::Error;
  m.id = 9;
  m.error_kind = ErrorKind::UnknownFunction;
  m.error_message = "no function \"x\"";
  m.error_worker = "decoder";
  FrameDecoder decoder(FrameLimits{});
  auto out = decode_like_transport(encode_frame(m), 3, &decoder);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error_kind, ErrorKind::UnknownFunction);
  EXPECT_EQ(out[0].error_message, "no function \"x\"");
  EXPECT_EQ(out[0].error_worker, "decoder");

  Message hello;
  hello.kind = MessageKind::Control;
  hello.peer_name = "worker7";
  hello.peer_rank = 7;
  out = decode_like_transport(encode_frame(hello), 100, &decoder);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].peer_name, "worker7");
  EXPECT_EQ(out[0].peer_rank, 7);
}

TEST(Frame, SeveralFramesInOneBufferAllDecode) {
  std::string stream;
  for (int i = 0; i < 3; ++i) {
    Message m;
    m.id = i;
    m.value = torch::full({3}, i);
    EncodedFrame f = encode_frame(m);
    stream.append(f.head.begin(), f.head.end());
    stream.append(static_cast<const char*>(f.tensors[0].data_ptr()), f.tensors[0].nbytes());
  }
  FrameDecoder decoder(FrameLimits{});
  std::vector<Message> out;
  decoder.consume(stream.data(), stream.size(), &out);
  ASSERT_EQ(out.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].id, static_cast<uint64_t>(i));
    EXPECT_TRUE(torch::equal(out[i].value.toTensor(), torch::full({3}, i)));
  }
}

TEST(Frame, UnsendableValuesAreRefusedWithTheirType) {
  Message m;
  m.value = torch::eye(3).to_sparse();
  try {
    encode_frame(m);
    FAIL() << "sparse tensor was encoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Sparse"), std::string::npos) << e.what();
  }
  m.value = c10::IValue(c10::Device(c10::kCPU));
  EXPECT_THAT(kind_and_error_of([&] { encode_frame(m); }), HasSubstr("InvalidArgument: "));
  EXPECT_THAT(kind_and_error_of([&] { encode_frame(m); }), HasSubstr("Device"));
}

// ---- validation of bytes from the wire -------------------------------------------------------

std::string bad_frame_reason(const std::string& bytes, FrameLimits limits = {}) {
  FrameDecoder decoder(limits);
  std::vector<Message> out;
  try {
    decoder.consume(bytes.data(), bytes.size(), &out);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadFrame);
    return e.what();
  }
  return "accepted";
}

std::string header(uint32_t magic, uint32_t envelope, uint64_t payload) {
  std::string h(16, '\0');
  std::memcpy(&h[0], &magic, 4);
  std::memcpy(&h[4], &envelope, 4);
  std::memcpy(&h[8], &payload, 8);
  return h;
}

// A frame whose envelope is built by hand, to say things encode_frame never would.
std::string forged(const std::function<void(wire::Envelope::Builder)>& fill, uint64_t payload) {
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  env.setVersion(kProtocolVersion);
  env.initValue().setNone();
  fill(env);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return header(kFrameMagic, bytes.size(), payload) +
         std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()) +
         std::string(payload, '\0');
}

TEST(FrameValidation, RejectsBadMagic) {
  EXPECT_NE(bad_frame_reason(header(0xdeadbeef, 8, 0)).find("bad magic"), std::string::npos);
}

TEST(FrameValidation, RejectsOversizedFrameBeforeReadingIt) {
  FrameLimits limits;
  limits.max_frame_bytes = 1 << 20;
  std::string reason = bad_frame_reason(header(kFrameMagic, 64, 1 << 21), limits);
  EXPECT_NE(reason.find("exceeds the limit"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsMisalignedEnvelope) {
  EXPECT_NE(bad_frame_reason(header(kFrameMagic, 13, 0)).find("multiple of 8"), std::string::npos);
}

TEST(FrameValidation, RejectsGarbageEnvelope) {
  std::string garbage(64, '\xff');
  std::string reason = bad_frame_reason(header(kFrameMagic, 64, 0) + garbage);
  EXPECT_NE(reason.find("malformed envelope"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsOtherProtocolVersion) {
  std::string reason = bad_frame_reason(forged([](auto env) { env.setVersion(99); }, 0));
  EXPECT_NE(reason.find("protocol version 99"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsShapeThatDisagreesWithByteLength) {
  std::string reason = bad_frame_reason(forged(
      [](auto env) {
        auto t = env.initTensors(1)[0];
        t.setDtype(wire::DType::FLOAT32);
        t.initShape(2).set(0, 4);
        t.getShape().set(1, 4);
        t.setByteLength(60);
        env.initValue().setTensor(0);
      },
      60));
  EXPECT_NE(reason.find("declares 60 bytes"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsUnknownDtype) {
  std::string reason = bad_frame_reason(forged(
      [](auto env) {
        auto t = env.initTensors(1)[0];
        t.setDtype(static_cast<wire::DType>(200));
        t.initShape(1).set(0, 1);
        t.setByteLength(4);
      },
      4));
  EXPECT_NE(reason.find("unknown dtype 200"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsPayloadThatDisagreesWithTensors) {
  std::string reason = bad_frame_reason(forged(
      [](auto env) {
        auto t = env.initTensors(1)[0];
        t.setDtype(wire::DType::INT8);
        t.initShape(1).set(0, 4);
        t.setByteLength(4);
      },
      8));
  EXPECT_NE(reason.find("header announces 8"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsTensorIndexOutOfRange) {
  std::string reason = bad_frame_reason(forged([](auto env) { env.initValue().setTensor(3); }, 0));
  EXPECT_NE(reason.find("tensor index 3"), std::string::npos) << reason;
}

TEST(FrameValidation, RejectsNestingDeeperThanTheLimit) {
  c10::IValue value = int64_t{1};
  for (int i = 0; i < 10; ++i) value = c10::ivalue::Tuple::create({value});
  Message m;
  m.value = value;
  EncodedFrame frame = encode_frame(m);
  FrameLimits limits;
  limits.max_nesting_depth = 5;
  std::string reason = bad_frame_reason(std::string(frame.head.begin(), frame.head.end()), limits);
  EXPECT_NE(reason.find("nested deeper"), std::string::npos) << reason;
  EXPECT_THAT(kind_and_error_of([&] { encode_frame(m, 5); }),
              HasSubstr("InvalidArgument: value is nested deeper than the limit of 5"));
}

}  // namespace
}  // namespace ferry::rpc
