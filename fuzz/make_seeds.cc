// Writes the seed corpus of frame_fuzzer: one file per kind of frame Ferry sends (handshake
// steps, calls with tensors and nested containers, replies, errors), and per kind of message the
// rendezvous store takes (a hello, a set, a wait, a compare-and-set), each prefixed with the
// fuzzer's chunk-size byte. Run it again when the wire format changes:
//   build/fuzz/make_seeds fuzz/corpus/frames
#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <string>

#include "rpc/auth.h"
#include "rpc/frame.h"
#include "rpc/store_protocol.h"

using ferry::rpc::HandshakeStep;
using ferry::rpc::Message;
using ferry::rpc::MessageKind;

namespace {

void write_seed(const std::string& dir, const std::string& name, const Message& message,
                unsigned char chunk) {
  ferry::rpc::EncodedFrame frame = ferry::rpc::encode_frame(message);
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(chunk));
  out.write(frame.head.data(), static_cast<std::streamsize>(frame.head.size()));
  for (const at::Tensor& t : frame.tensors) {
    if (t.defined()) out.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
}

void write_store_seed(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(255));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_store_seeds(const std::string& dir) {
  namespace store = ferry::rpc::store;
  store::Greeting hello;
  hello.rank = 1;
  hello.name = "worker1";
  hello.handshake = {HandshakeStep::Hello, std::string(ferry::rpc::auth::kNonceBytes, 'c'),
                     ferry::rpc::auth::fresh_nonce(), std::string(32, 'p')};
  write_store_seed(dir, "store_hello", store::encode(hello));
  store::Request set{store::Op::Set, {"ferry/worker/1"}, "worker1\n127.0.0.1\n4000", "", 0, 0};
  write_store_seed(dir, "store_set", store::encode(set));
  store::Request wait{store::Op::Wait, {"a", "b", "c"}, "", "", 0, 0};
  write_store_seed(dir, "store_wait", store::encode(wait));
  store::Request swap{store::Op::CompareSet, {"key"}, "old", "new", 0, 0};
  write_store_seed(dir, "store_compare_set", store::encode(swap));
  store::Request add{store::Op::Add, {"ferry/joined"}, "", "", 1, 0};
  write_store_seed(dir, "store_add", store::encode(add));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds DIR\n";
    return 2;
  }
  std::string dir = argv[1];
  std::string challenge(ferry::rpc::auth::kNonceBytes, 'c'), nonce(32, 'n');

  Message challenge_msg;
  challenge_msg.kind = MessageKind::Control;
  challenge_msg.handshake = {HandshakeStep::Challenge, challenge, "", ""};
  write_seed(dir, "challenge", challenge_msg, 255);

  Message hello = challenge_msg;
  hello.peer_name = "worker1";
  hello.peer_rank = 1;
  hello.handshake = {
      HandshakeStep::Hello, challenge, nonce,
      ferry::rpc::auth::hello_proof("fuzzing secret", challenge, nonce, 1, "worker1")};
  write_seed(dir, "hello", hello, 7);

  Message welcome = challenge_msg;
  welcome.handshake = {HandshakeStep::Welcome, challenge, nonce,
                       ferry::rpc::auth::welcome_proof("fuzzing secret", challenge, nonce)};
  write_seed(dir, "welcome", welcome, 255);

  Message request;
  request.kind = MessageKind::Request;
  request.id = 42;
  request.function = "ferry.stage.forward";
  request.value = c10::ivalue::Tuple::create(
      {c10::IValue(at::arange(12, at::kFloat).view({3, 4})), c10::IValue(int64_t{7}),
       c10::IValue(std::string("encoder")), c10::IValue(at::Tensor())});
  write_seed(dir, "request_tensors", request, 255);
  write_seed(dir, "request_tensors_small_reads", request, 3);

  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("weight", at::ones({2, 2}, at::kDouble));
  dict.insert("mask", at::zeros({4}, at::kBool));
  c10::List<int64_t> ints({1, 2, 3});
  Message nested;
  nested.kind = MessageKind::Request;
  nested.id = 43;
  nested.function = "ferry.stage.load_state_dict";
  nested.value = c10::ivalue::Tuple::create(
      {c10::IValue(dict), c10::IValue(ints), c10::IValue(std::vector<double>{0.5, 1.5}),
       c10::IValue(c10::ivalue::Tuple::create({c10::IValue(true), c10::IValue()}))});
  write_seed(dir, "request_nested", nested, 255);

  Message response;
  response.kind = MessageKind::Response;
  response.id = 42;
  response.value = c10::IValue(at::full({64}, 3.0f).to(at::kHalf));
  response.grad = {5, 9};
  write_seed(dir, "response_grad", response, 255);

  Message error;
  error.kind = MessageKind::Error;
  error.id = 44;
  error.error_kind = ferry::rpc::ErrorKind::RemoteException;
  error.error_message = "stage \"decoder\" raised: shape mismatch";
  error.error_worker = "worker2";
  write_seed(dir, "error", error, 255);
  write_store_seeds(dir);
  return 0;
}
