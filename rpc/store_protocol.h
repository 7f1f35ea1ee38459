// The rendezvous store's protocol: what a store client and rank 0's store server say to each
// other over a blocking TCP socket (value types and functions).
//
// Each message is a 4-byte little-endian length, then one Cap'n Proto message (rpc/wire.capnp).
// A connection opens with the handshake of Ferry's own connections (rpc/auth.h): the server's
// challenge, the client's hello with its proof of the cluster secret, and the server's welcome
// with its own proof, or a refusal saying why. Then each request gets exactly one reply.
//
// Every function here runs on the calling thread; a socket is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "rpc/frame.h"

namespace ferry::rpc::store {

using Clock = std::chrono::steady_clock;

// Larger than anything a rendezvous or a Gloo group stores (addresses, counters), small enough
// that a forged length cannot make the server allocate much.
constexpr std::uint32_t kMaxMessageBytes = 1u << 20;

enum class Op : std::uint8_t { Set, Get, Add, Check, DeleteKey, NumKeys, Wait, CompareSet };

struct Request {
  Op op = Op::Get;
  std::vector<std::string> keys;
  std::string value;    // Set: the value; CompareSet: the value expected
  std::string desired;  // CompareSet
  std::int64_t amount = 0;
  std::int64_t timeout_ms = 0;  // Get, Wait
};

struct Reply {
  bool ok = true;
  std::string value;
  std::int64_t number = 0;
  std::string error;  // !ok: why
};

// A handshake step, with who the client says it is (its hello).
struct Greeting {
  Handshake handshake;
  int rank = -1;
  std::string name;
};

std::string encode(const Request& request);
std::string encode(const Reply& reply);
std::string encode(const Greeting& greeting);
// Each throws Error(BadFrame) saying what is wrong with `bytes`.
Request decode_request(const std::string& bytes);
Reply decode_reply(const std::string& bytes);
Greeting decode_greeting(const std::string& bytes);

// `message` as it goes on the wire: its length, then its bytes.
std::string framed(const std::string& message);

// One message each way on a connected socket, before `deadline` (Clock::time_point::max():
// none). Throw Error(Timeout) past the deadline, Error(PeerDied) when the other side closed or
// reset the connection, and Error(BadFrame) for a length over kMaxMessageBytes. `peer` names the
// other side in those messages.
void send_message(int fd, const std::string& bytes, Clock::time_point deadline,
                  const std::string& peer);
std::string receive_message(int fd, Clock::time_point deadline, const std::string& peer);

}  // namespace ferry::rpc::store
