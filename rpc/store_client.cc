// Called from any thread; the mutex serialises requests on the one connection.
#include "rpc/store_client.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "ferry/core/backoff.h"
#include "rpc/auth.h"

namespace ferry::rpc::store {
namespace {

// A connected socket to host:port, or -1 with `why` set.
int dial(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    why = fmt::format("cannot resolve \"{}\": {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    why = strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

StoreClient::StoreClient(ClientSettings settings, Clock::time_point deadline)
    : c10d::Store(settings.timeout),
      settings_(std::move(settings)),
      server_(fmt::format("the rendezvous store at {}:{}", settings_.host, settings_.port)) {
  connect(deadline);
  try {
    handshake(deadline);
  } catch (const Error& e) {
    ::close(fd_);
    throw Error(ErrorKind::Init, e.what());
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::connect(Clock::time_point deadline) {
  std::string why;
  auto reached = [&] {
    fd_ = dial(settings_.host, settings_.port, why);
    return fd_ >= 0;
  };
  if (!core::poll_with_backoff(reached, deadline)) {
    throw Error(ErrorKind::Init, fmt::format("cannot connect to {}: {}", server_, why));
  }
}

void StoreClient::handshake(Clock::time_point deadline) {
  Greeting challenge = decode_greeting(receive_message(fd_, deadline, server_));
  if (challenge.handshake.step != HandshakeStep::Challenge) {
    throw Error(ErrorKind::BadFrame, fmt::format("{} opened without a challenge", server_));
  }
  Greeting hello;
  hello.rank = settings_.rank;
  hello.name = settings_.name;
  hello.handshake = {HandshakeStep::Hello, challenge.handshake.challenge, auth::fresh_nonce(), {}};
  hello.handshake.proof = auth::hello_proof(settings_.secret, hello.handshake.challenge,
                                            hello.handshake.nonce, hello.rank, hello.name);
  send_message(fd_, encode(hello), deadline, server_);
  Reply welcome = decode_reply(receive_message(fd_, deadline, server_));
  if (!welcome.ok) {
    throw Error(ErrorKind::Init,
                fmt::format("{}: {} (is FERRY_SECRET the same on both?)", server_, welcome.error));
  }
  if (!settings_.secret.empty() &&
      !auth::proofs_equal(
          auth::welcome_proof(settings_.secret, hello.handshake.challenge, hello.handshake.nonce),
          welcome.value)) {
    throw Error(ErrorKind::Init, fmt::format("{} did not prove that it holds the cluster secret "
                                             "(FERRY_SECRET)",
                                             server_));
  }
}

Reply StoreClient::call(const Request& request) {
  // A get or a wait may take as long as it asks the server to wait, and a little more.
  const auto limit = std::chrono::milliseconds(request.timeout_ms) + settings_.timeout;
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) throw Error(ErrorKind::PeerDied, fmt::format("{} is not connected", server_));
  try {
    send_message(fd_, encode(request), Clock::now() + limit, server_);
    return decode_reply(receive_message(fd_, Clock::now() + limit, server_));
  } catch (const Error&) {
    // Half a request or reply may be in flight: the connection cannot be trusted again.
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

std::chrono::milliseconds StoreClient::wait_limit(std::chrono::milliseconds timeout) const {
  // c10d's kNoTimeout (zero): a day, so that nothing waits for ever.
  return timeout == kNoTimeout ? std::chrono::hours(24) : timeout;
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  Request request;
  request.op = Op::Set;
  request.keys = {key};
  request.value = text_of(value);
  call(request);
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  Request request;
  request.op = Op::CompareSet;
  request.keys = {key};
  request.value = text_of(expected);
  request.desired = text_of(desired);
  return bytes_of(call(request).value);
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  Request request;
  request.op = Op::Get;
  request.keys = {key};
  request.timeout_ms = wait_limit(timeout_).count();
  Reply reply = call(request);
  if (!reply.ok) throw Error(ErrorKind::Timeout, fmt::format("{}: {}", server_, reply.error));
  return bytes_of(reply.value);
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  Request request;
  request.op = Op::Add;
  request.keys = {key};
  request.amount = value;
  Reply reply = call(request);
  if (!reply.ok)
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}: {}", server_, reply.error));
  return reply.number;
}

bool StoreClient::deleteKey(const std::string& key) {
  Request request;
  request.op = Op::DeleteKey;
  request.keys = {key};
  return call(request).number > 0;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  Request request;
  request.op = Op::Check;
  request.keys = keys;
  return call(request).number > 0;
}

int64_t StoreClient::getNumKeys() {
  Request request;
  request.op = Op::NumKeys;
  return call(request).number;
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  Request request;
  request.op = Op::Wait;
  request.keys = keys;
  request.timeout_ms = wait_limit(timeout).count();
  Reply reply = call(request);
  if (!reply.ok) throw Error(ErrorKind::Timeout, fmt::format("{}: {}", server_, reply.error));
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(settings_, Clock::now() + settings_.timeout);
}

}  // namespace ferry::rpc::store
