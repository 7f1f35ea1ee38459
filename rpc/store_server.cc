// The accepting thread runs accept_loop(); each connection's thread runs serve(). The owner's
// thread constructs and destroys.
#include "rpc/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ferry/core/log.h"
#include "rpc/auth.h"

namespace ferry::rpc::store {
namespace {

// Connections that have not yet passed the handshake, at most: a flood of them costs a thread
// each for at most the handshake timeout, and then no more are taken.
constexpr int kMaxUnadmitted = 64;

std::string address_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, host, sizeof host);
  return fmt::format("{}:{}", host, ntohs(addr.sin_port));
}

Error init_error(const char* doing) {
  return Error(ErrorKind::Init, fmt::format("{}: {}", doing, strerror(errno)));
}

}  // namespace

struct StoreServer::Client {
  int fd = -1;
  std::string peer;
  std::thread thread;
  std::atomic<bool> done{false};
};

StoreServer::StoreServer(ServerSettings settings) : settings_(std::move(settings)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw init_error("socket");
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(settings_.port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 128) != 0 || ::pipe2(wake_, O_CLOEXEC) != 0) {
    Error error = init_error("cannot listen");
    ::close(listen_fd_);
    throw error;
  }
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

StoreServer::~StoreServer() {
  stopping_ = true;
  char byte = 0;
  if (::write(wake_[1], &byte, 1) < 0) log::warn("store: cannot wake the accepting thread");
  acceptor_.join();
  table_.close();
  for (auto& client : clients_) ::shutdown(client->fd, SHUT_RDWR);
  for (auto& client : clients_) {
    client->thread.join();
    ::close(client->fd);
  }
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string StoreServer::refusal_of(int rank) {
  std::lock_guard<std::mutex> lock(refusals_mutex_);
  auto it = refusals_.find(rank);
  return it == refusals_.end() ? std::string() : it->second;
}

void StoreServer::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log::error("store: poll failed, no more connections are taken: {}", strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    reap_finished();
    if (unadmitted_ >= kMaxUnadmitted) {
      log::warn(
          "store: refused a connection from {}: {} others have not finished their "
          "handshake",
          address_of(fd), kMaxUnadmitted);
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto client = std::make_unique<Client>();
    client->fd = fd;
    client->peer = fmt::format("the connection from {}", address_of(fd));
    Client& c = *client;
    ++unadmitted_;
    std::lock_guard<std::mutex> lock(clients_mutex_);
    clients_.push_back(std::move(client));
    c.thread = std::thread([this, &c] {
      serve(c);
      // The peer learns at once that it was closed; the descriptor itself is closed when the
      // thread is joined, so that no other thread can shut down a number the system reused.
      ::shutdown(c.fd, SHUT_RDWR);
      c.done = true;
    });
  }
}

void StoreServer::reap_finished() {
  std::lock_guard<std::mutex> lock(clients_mutex_);
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    (*it)->thread.join();
    ::close((*it)->fd);
    it = clients_.erase(it);
  }
}

// The handshake of rpc/auth.h: a challenge, the client's hello, and the welcome (a Reply whose
// value is this side's proof) or a refusal that says why.
bool StoreServer::admit(Client& client) {
  const auto deadline = Clock::now() + settings_.handshake_timeout;
  Greeting challenge;
  challenge.handshake.step = HandshakeStep::Challenge;
  challenge.handshake.challenge = auth::fresh_nonce();
  send_message(client.fd, encode(challenge), deadline, client.peer);
  Greeting hello = decode_greeting(receive_message(client.fd, deadline, client.peer));
  const char* fault =
      hello.handshake.step != HandshakeStep::Hello
          ? "its first message was not a hello"
          : auth::hello_fault(settings_.secret, challenge.handshake.challenge, settings_.world_size,
                              hello.handshake.challenge, hello.handshake.nonce,
                              hello.handshake.proof, hello.rank, hello.name);
  Reply welcome;
  if (fault != nullptr) {
    log::warn("store: rejected {} claiming to be \"{}\" (rank {}): {}", client.peer, hello.name,
              hello.rank, fault);
    welcome.ok = false;
    if (hello.rank >= 0 && hello.rank < settings_.world_size) {
      std::lock_guard<std::mutex> lock(refusals_mutex_);
      refusals_[hello.rank] = fmt::format("from {}: {}", address_of(client.fd), fault);
    }
    welcome.error = fmt::format("the rendezvous store rejected it: {}", fault);
  } else {
    welcome.value =
        auth::welcome_proof(settings_.secret, challenge.handshake.challenge, hello.handshake.nonce);
  }
  send_message(client.fd, encode(welcome), deadline, client.peer);
  return welcome.ok;
}

void StoreServer::serve(Client& client) {
  bool admitted = false;
  try {
    admitted = admit(client);
  } catch (const std::exception& e) {
    if (!stopping_) log::warn("store: closing {}: {}", client.peer, e.what());
  }
  --unadmitted_;
  if (!admitted) return;
  client.peer = fmt::format("a member's {}", client.peer);
  try {
    for (;;) {
      Request request =
          decode_request(receive_message(client.fd, Clock::time_point::max(), client.peer));
      Reply reply = table_.apply(request);
      send_message(client.fd, encode(reply), Clock::now() + settings_.handshake_timeout,
                   client.peer);
    }
  } catch (const Error& e) {
    // A member closing its connection is how a client says goodbye.
    if (stopping_ || e.kind() == ErrorKind::PeerDied) return;
    log::warn("store: closing {}: {}", client.peer, e.what());
  } catch (const std::exception& e) {
    // Whatever a client sent, it costs that client its connection, never this process.
    log::warn("store: closing {}: {}", client.peer, e.what());
  }
}

}  // namespace ferry::rpc::store
