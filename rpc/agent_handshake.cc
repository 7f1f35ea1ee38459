// A connection's handshake (see rpc/auth.h): the challenge an accepting agent sends, the hello
// a connecting one answers with, and the welcome that proves the secret back. Loop thread.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/core/log.h"
#include "rpc/agent_state.h"
#include "rpc/auth.h"

namespace ferry::rpc {

void Agent::State::on_handshake(Connection& connection, const Message& message) {
  const Handshake& step = message.handshake;
  HandshakeState& state = connection.handshake();
  const std::string& secret = options.secret;
  if (connection.outbound_rank() >= 0) {
    if (step.step == HandshakeStep::Challenge && !state.hello_sent) {
      state.challenge = step.challenge;
      state.nonce = auth::fresh_nonce();
      state.hello_sent = true;
      Message hello;
      hello.kind = MessageKind::Control;
      hello.peer_name = self.name;
      hello.peer_rank = self.rank;
      hello.handshake = {
          HandshakeStep::Hello, state.challenge, state.nonce,
          auth::hello_proof(secret, state.challenge, state.nonce, self.rank, self.name)};
      connection.write_now(encode_frame(hello));
      return;
    }
    if (step.step == HandshakeStep::Welcome && state.hello_sent && !state.done) {
      if (!secret.empty() &&
          !auth::proofs_equal(auth::welcome_proof(secret, state.challenge, state.nonce),
                              step.proof)) {
        std::string who = workers.empty() ? fmt::format("rank {}", connection.outbound_rank())
                                          : workers[connection.outbound_rank()].describe();
        log::warn(
            "closing the connection to {} at {}: it did not prove that it holds the "
            "cluster secret",
            who, connection.remote_address());
        connection.close("it did not prove that it holds the cluster secret (FERRY_SECRET)");
        return;
      }
      state.done = true;
      connection.release();
      publish_writer(&connection);
      return;
    }
  } else if (step.step == HandshakeStep::Hello && !connection.identified()) {
    const char* fault =
        auth::hello_fault(secret, state.challenge, options.world_size, step.challenge, step.nonce,
                          step.proof, message.peer_rank, message.peer_name);
    if (fault != nullptr) {
      log::warn("rejected a connection from {} claiming to be \"{}\" (rank {}): {}",
                connection.remote_address(), message.peer_name, message.peer_rank, fault);
      connection.close(fmt::format("rejected: {}", fault));
      return;
    }
    connection.set_peer(message.peer_name, message.peer_rank);
    state.nonce = step.nonce;
    state.done = true;
    Message welcome;
    welcome.kind = MessageKind::Control;
    welcome.handshake = {HandshakeStep::Welcome, state.challenge, state.nonce,
                         auth::welcome_proof(secret, state.challenge, state.nonce)};
    connection.write(encode_frame(welcome));
    return;
  }
  log::warn("closing connection from {}: handshake message out of order",
            connection.remote_address());
  connection.close("handshake message out of order");
}

void Agent::State::close_stalled_handshakes() {
  auto limit = Clock::now() - options.handshake_timeout;
  for (auto& [id, connection] : connections) {
    if (connection->outbound_rank() < 0 && !connection->identified() && !connection->closing() &&
        connection->handshake().opened_at < limit) {
      log::warn("closing connection from {}: no hello within {} ms", connection->remote_address(),
                options.handshake_timeout.count());
      connection->close("no hello");
    }
  }
}

}  // namespace ferry::rpc
