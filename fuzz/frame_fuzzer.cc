// libFuzzer target: bytes from the network as one connection reads them. The frame decoder must
// turn every input into messages or an rpc::Error (the connection is then closed); any other
// exception, a crash, or a sanitizer report is a bug. Decoded handshake messages go through the
// hello check an agent runs on them. The same bytes, read as one message of the rendezvous
// store, must decode or raise an rpc::Error too, and a request that decodes is applied to a
// store's table.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/rpc/error.h"
#include "rpc/auth.h"
#include "rpc/frame.h"
#include "rpc/store_protocol.h"
#include "rpc/store_table.h"

namespace {

const std::string kSecret = "fuzzing secret";
const std::string kChallenge(ferry::rpc::auth::kNonceBytes, 'c');

void check_handshake(const ferry::rpc::Message& message) {
  if (message.kind != ferry::rpc::MessageKind::Control) return;
  const ferry::rpc::Handshake& h = message.handshake;
  for (const std::string& secret : {kSecret, std::string()}) {
    ferry::rpc::auth::hello_fault(secret, kChallenge, 4, h.challenge, h.nonce, h.proof,
                                  message.peer_rank, message.peer_name);
  }
  ferry::rpc::auth::proofs_equal(ferry::rpc::auth::welcome_proof(kSecret, kChallenge, h.nonce),
                                 h.proof);
}

// What the store server does with a message's bytes: a hello, or a request it applies.
void check_store_message(const std::string& bytes) {
  namespace store = ferry::rpc::store;
  try {
    store::decode_greeting(bytes);
  } catch (const ferry::rpc::Error&) {
  }
  try {
    store::decode_reply(bytes);
  } catch (const ferry::rpc::Error&) {
  }
  try {
    store::Request request = store::decode_request(bytes);
    request.timeout_ms = 0;  // a get of a missing key would otherwise wait
    store::StoreTable table;
    table.apply(request);
  } catch (const ferry::rpc::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks how the rest arrives: in reads of 1 to 256 bytes, as a socket may
  // split it anywhere.
  std::size_t chunk = 1 + data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  std::size_t n = size - 1;
  // Small limits, so that a frame announcing gigabytes is refused rather than allocated.
  ferry::rpc::FrameLimits limits{1 << 20, 16};
  ferry::rpc::FrameDecoder decoder(limits);
  std::vector<ferry::rpc::Message> messages;
  try {
    for (std::size_t at = 0; at < n;) {
      auto [target, missing] = decoder.direct_target();
      std::size_t take = std::min(chunk, n - at);
      if (target != nullptr && missing > 0) {
        // The connection reads a tensor's bytes straight into its memory.
        take = std::min(take, missing);
        std::copy(bytes + at, bytes + at + take, target);
        decoder.commit_direct(take, &messages);
      } else {
        decoder.consume(bytes + at, take, &messages);
      }
      at += take;
    }
  } catch (const ferry::rpc::Error&) {
    // The connection would be closed: the expected answer to malformed bytes.
  }
  for (const ferry::rpc::Message& m : messages) check_handshake(m);
  check_store_message(std::string(bytes, n));
  return 0;
}
