#include "rpc/auth.h"

#include <sodium.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>

namespace ferry::rpc::auth {
namespace {

void ensure_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium failed to initialise");
}

// Each part is preceded by its length, so that no part can be shifted across a boundary.
std::string framed(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) {
    std::uint64_t n = p.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += p;
  }
  return out;
}

// HMAC-SHA-256 keyed by a hash of the secret: the secret may be any length, the key is 32 bytes.
std::string mac(const std::string& secret, const std::string& message) {
  ensure_sodium();
  unsigned char key[crypto_auth_hmacsha256_KEYBYTES];
  crypto_generichash(key, sizeof key, reinterpret_cast<const unsigned char*>(secret.data()),
                     secret.size(), nullptr, 0);
  std::string out(crypto_auth_hmacsha256_BYTES, '\0');
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(out.data()),
                         reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                         key);
  sodium_memzero(key, sizeof key);
  return out;
}

}  // namespace

std::string fresh_nonce() {
  ensure_sodium();
  std::string out(kNonceBytes, '\0');
  randombytes_buf(out.data(), out.size());
  return out;
}

std::string hello_proof(const std::string& secret, const std::string& challenge,
                        const std::string& nonce, int rank, const std::string& name) {
  if (secret.empty()) return {};
  // The label keeps the two proofs apart, so that a welcome can never pass for a hello.
  return mac(secret, framed({"ferry hello v1", challenge, nonce, std::to_string(rank), name}));
}

std::string welcome_proof(const std::string& secret, const std::string& challenge,
                          const std::string& nonce) {
  if (secret.empty()) return {};
  return mac(secret, framed({"ferry welcome v1", nonce, challenge}));
}

const char* hello_fault(const std::string& secret, const std::string& challenge, int world_size,
                        const std::string& answered_challenge, const std::string& nonce,
                        const std::string& proof, int rank, const std::string& name) {
  if (answered_challenge != challenge) return "it answered another challenge";
  if (rank < 0 || rank >= world_size) return "its rank is not in this world";
  if (secret.empty()) return nullptr;
  if (proof.empty()) return "it has no cluster secret";
  if (!proofs_equal(hello_proof(secret, challenge, nonce, rank, name), proof)) {
    return "its proof of the cluster secret is wrong";
  }
  return nullptr;
}

bool proofs_equal(const std::string& expected, const std::string& given) {
  return expected.size() == crypto_auth_hmacsha256_BYTES && given.size() == expected.size() &&
         crypto_verify_32(reinterpret_cast<const unsigned char*>(expected.data()),
                          reinterpret_cast<const unsigned char*>(given.data())) == 0;
}

}  // namespace ferry::rpc::auth
