// Runs on whichever thread holds the socket: a store client's caller, or the server thread that
// serves one connection.
#include "rpc/store_protocol.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rpc/wire.capnp.h"
#include "rpc/wire_hello.h"

namespace ferry::rpc::store {
namespace {

std::string flat(capnp::MallocMessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// Decodes one message of root type T with `read`, turning every malformation into BadFrame.
template <typename T, typename Read>
auto decode(const std::string& bytes, const char* what, Read read) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("a store {} of {} bytes is not whole words", what, bytes.size()));
  }
  std::vector<capnp::word> words(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.data(), bytes.data(), bytes.size());
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words.size() * 4 + 64;
  options.nestingLimit = 8;
  try {
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words.data(), words.size()), options);
    return read(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("a malformed store {}: {}", what, e.getDescription().cStr()));
  }
}

// Waits until `fd` can be read (or written) or `deadline` passes.
void await(int fd, short events, Clock::time_point deadline, const std::string& peer,
           const char* doing) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline != Clock::time_point::max()) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        throw Error(ErrorKind::Timeout, fmt::format("{} did not answer in time ({})", peer, doing));
      }
      timeout_ms = static_cast<int>(std::min<long long>(left, 1 << 30));
    }
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return;
    if (n < 0 && errno != EINTR) {
      throw Error(ErrorKind::PeerDied, fmt::format("{}: poll failed: {}", peer, strerror(errno)));
    }
  }
}

void read_exact(int fd, char* out, std::size_t n, Clock::time_point deadline,
                const std::string& peer) {
  while (n > 0) {
    await(fd, POLLIN, deadline, peer, "reading");
    ssize_t got = ::recv(fd, out, n, 0);
    if (got == 0) {
      throw Error(ErrorKind::PeerDied, fmt::format("{} closed the connection", peer));
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      throw Error(ErrorKind::PeerDied,
                  fmt::format("{}: the connection failed: {}", peer, strerror(errno)));
    }
    out += got;
    n -= static_cast<std::size_t>(got);
  }
}

}  // namespace

std::string encode(const Request& request) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::StoreRequest>();
  r.setOp(static_cast<wire::StoreOp>(request.op));
  auto keys = r.initKeys(request.keys.size());
  for (std::size_t i = 0; i < request.keys.size(); ++i) keys.set(i, wire_bytes(request.keys[i]));
  r.setValue(wire_bytes(request.value));
  r.setDesired(wire_bytes(request.desired));
  r.setAmount(request.amount);
  r.setTimeoutMs(request.timeout_ms);
  return flat(builder);
}

std::string encode(const Reply& reply) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::StoreReply>();
  r.setOk(reply.ok);
  r.setValue(wire_bytes(reply.value));
  r.setNumber(reply.number);
  r.setError(wire_text(reply.error));
  return flat(builder);
}

std::string encode(const Greeting& greeting) {
  capnp::MallocMessageBuilder builder;
  write_hello(builder.initRoot<wire::Hello>(), greeting.name, greeting.rank, greeting.handshake);
  return flat(builder);
}

Request decode_request(const std::string& bytes) {
  return decode<wire::StoreRequest>(bytes, "request", [](wire::StoreRequest::Reader r) {
    Request request;
    auto op = static_cast<unsigned>(r.getOp());
    if (op > static_cast<unsigned>(Op::CompareSet)) {
      throw Error(ErrorKind::BadFrame, fmt::format("store request with unknown operation {}", op));
    }
    request.op = static_cast<Op>(op);
    for (auto key : r.getKeys()) request.keys.push_back(string_of(key));
    request.value = string_of(r.getValue());
    request.desired = string_of(r.getDesired());
    request.amount = r.getAmount();
    request.timeout_ms = r.getTimeoutMs();
    return request;
  });
}

Reply decode_reply(const std::string& bytes) {
  return decode<wire::StoreReply>(bytes, "reply", [](wire::StoreReply::Reader r) {
    Reply reply;
    reply.ok = r.getOk();
    reply.value = string_of(r.getValue());
    reply.number = r.getNumber();
    reply.error = r.getError().cStr();
    return reply;
  });
}

Greeting decode_greeting(const std::string& bytes) {
  return decode<wire::Hello>(bytes, "handshake", [](wire::Hello::Reader h) {
    Greeting greeting;
    read_hello(h, &greeting.name, &greeting.rank, &greeting.handshake);
    return greeting;
  });
}

std::string framed(const std::string& message) {
  std::uint32_t n = static_cast<std::uint32_t>(message.size());
  std::string out(reinterpret_cast<const char*>(&n), sizeof n);
  return out + message;
}

void send_message(int fd, const std::string& bytes, Clock::time_point deadline,
                  const std::string& peer) {
  const std::string out = framed(bytes);
  std::size_t sent = 0;
  while (sent < out.size()) {
    await(fd, POLLOUT, deadline, peer, "writing");
    // MSG_NOSIGNAL: a peer gone mid-write is an error to report, not a SIGPIPE to die of.
    ssize_t k = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      throw Error(ErrorKind::PeerDied,
                  fmt::format("{}: the connection failed: {}", peer, strerror(errno)));
    }
    sent += static_cast<std::size_t>(k);
  }
}

std::string receive_message(int fd, Clock::time_point deadline, const std::string& peer) {
  char head[4];
  read_exact(fd, head, sizeof head, deadline, peer);
  std::uint32_t n;
  std::memcpy(&n, head, sizeof n);
  if (n > kMaxMessageBytes) {
    throw Error(ErrorKind::BadFrame, fmt::format("{} sent a store message of {} bytes (at most {})",
                                                 peer, n, kMaxMessageBytes));
  }
  std::string bytes(n, '\0');
  read_exact(fd, bytes.data(), n, deadline, peer);
  return bytes;
}

}  // namespace ferry::rpc::store
