// Frames: what one message looks like on the wire, and how it is checked on the way in.
//
// A frame is a 16-byte header {magic "FRY1", envelope bytes (u32), payload bytes (u64)}, then a
// Cap'n Proto envelope (rpc/wire.capnp), then the raw bytes of each tensor the envelope
// describes, in order. Tensor bytes are never copied into the envelope: the sender writes them
// straight from tensor memory and the receiver reads them straight into fresh tensors.
//
// encode_frame runs on the caller's thread; FrameDecoder belongs to one connection and is used
// only by the thread that reads that connection.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/rpc/error.h"
#include "ferry/rpc/grad_observer.h"

namespace ferry::rpc {

constexpr std::uint16_t kProtocolVersion = 2;
constexpr std::uint32_t kFrameMagic = 0x31595246;  // "FRY1" read as little-endian u32
constexpr std::size_t kFrameHeaderBytes = 16;

enum class MessageKind : std::uint8_t { Request, Response, Error, Control };

// Control messages are the steps of the handshake that opens a connection (see rpc/auth.h).
enum class HandshakeStep : std::uint8_t { Hello, Challenge, Welcome };
struct Handshake {
  HandshakeStep step = HandshakeStep::Hello;
  std::string challenge;  // Challenge, Hello: the accepting side's nonce
  std::string nonce;      // Hello, Welcome: the connecting side's nonce
  std::string proof;      // Hello, Welcome: HMAC of both nonces; empty in an open cluster
};

// One decoded message (value type). Which fields matter depends on `kind`.
struct Message {
  MessageKind kind = MessageKind::Request;
  std::uint64_t id = 0;
  std::string function;  // Request: the function to run
  c10::IValue value;     // Request: a tuple of arguments; Response: the result
  ErrorKind error_kind = ErrorKind::RemoteException;  // Error
  std::string error_message;                          // Error
  std::string error_worker;                           // Error: Error::worker()
  std::string peer_name;                              // Control: hello from the connecting side
  int peer_rank = -1;                                 // Control
  Handshake handshake;                                // Control
  GradTag grad;  // Request, Response: the autograd context it was sent in, if any
};

// An RRef as it travels: who owns the value, which value, and which copy of the reference.
struct RRefWire {
  int owner = -1;
  int id_rank = -1;
  std::uint64_t id_local = 0;
  int fork_rank = -1;
  std::uint64_t fork_local = 0;
};

// How frames turn RRefs into wire descriptions and back: sending forks the reference (the owner
// must learn of the new copy), receiving makes a handle. The agent provides it.
class RRefCodec {
 public:
  virtual ~RRefCodec() = default;
  // On the sending thread, for a message going to `to_rank`.
  virtual RRefWire fork_for_send(const c10::intrusive_ptr<c10::RRefInterface>& rref,
                                 int to_rank) = 0;
  // On the thread that decodes the frame.
  virtual c10::IValue receive(const RRefWire& wire) = 0;
};

struct FrameLimits {
  std::uint64_t max_frame_bytes = std::uint64_t{4} << 30;
  int max_nesting_depth = 64;
};

// A frame ready to write: `head` holds header and envelope; each tensor's bytes follow in order.
// The tensors are contiguous CPU tensors kept alive here until the write completes.
struct EncodedFrame {
  std::vector<char> head;
  std::vector<at::Tensor> tensors;
  std::uint64_t payload_bytes = 0;

  std::uint64_t size() const { return head.size() + payload_bytes; }
};

// Throws Error(InvalidArgument) naming the part of the value that cannot be sent. RRefs in the
// value need `rrefs` (and the destination `to_rank`).
EncodedFrame encode_frame(const Message& message, int max_nesting_depth = 64,
                          RRefCodec* rrefs = nullptr, int to_rank = -1);

// Incremental decoder of a byte stream into messages. Any violation of the format or of the
// limits throws Error(BadFrame) with the reason; the stream is then unusable and the transport
// closes the connection.
class FrameDecoder {
 public:
  explicit FrameDecoder(FrameLimits limits, RRefCodec* rrefs = nullptr)
      : limits_(limits), rrefs_(rrefs) {}

  // While tensor bytes are awaited: the memory they go to and how many are still missing, so the
  // transport can read straight into the tensor. {nullptr, 0} otherwise.
  std::pair<char*, std::size_t> direct_target() const;
  // `n` bytes were written into the memory direct_target() returned.
  void commit_direct(std::size_t n, std::vector<Message>* out);
  // Feeds bytes read into a transport buffer; completed messages are appended to `out`.
  void consume(const char* data, std::size_t n, std::vector<Message>* out);

  // Bytes of tensor payload copied out of transport buffers instead of read in place.
  std::uint64_t copied_payload_bytes() const { return copied_payload_bytes_; }

 private:
  enum class State { Header, Envelope, Payload };

  void finish_header();
  void finish_envelope(std::vector<Message>* out);
  void advance_payload(std::size_t n, std::vector<Message>* out);
  void skip_empty_tensors(std::vector<Message>* out);

  FrameLimits limits_;
  RRefCodec* rrefs_;
  State state_ = State::Header;
  char header_[kFrameHeaderBytes];
  std::size_t filled_ = 0;  // bytes of the header or envelope received so far
  std::uint32_t envelope_bytes_ = 0;
  std::uint64_t payload_bytes_ = 0;
  std::vector<std::uint64_t> envelope_;  // 8-byte aligned, as Cap'n Proto requires
  Message pending_;
  std::vector<at::Tensor> tensors_;
  std::size_t tensor_index_ = 0;
  std::size_t tensor_offset_ = 0;
  std::uint64_t copied_payload_bytes_ = 0;
};

}  // namespace ferry::rpc
