// Proofs that a peer holds the cluster secret, for the connection handshake (value functions).
//
// The handshake, on every connection: the accepting side sends a random challenge; the
// connecting side answers with its hello, its own random nonce and HMAC(secret, challenge, nonce,
// rank, name); the accepting side checks that and answers with HMAC(secret, nonce, challenge).
// Each side thus proves the secret to the other without sending it, and neither proof can be
// replayed on another connection: both nonces are fresh. Without a secret the proofs are empty
// and the cluster is open.
#pragma once

#include <string>

namespace ferry::rpc::auth {

constexpr std::size_t kNonceBytes = 32;

// kNonceBytes from the operating system's random source.
std::string fresh_nonce();

// The connecting side's proof, sent with its hello.
std::string hello_proof(const std::string& secret, const std::string& challenge,
                        const std::string& nonce, int rank, const std::string& name);
// The accepting side's proof, sent once the hello is verified.
std::string welcome_proof(const std::string& secret, const std::string& challenge,
                          const std::string& nonce);

// Why the hello of a peer claiming `rank` and `name` does not pass at an agent that sent
// `challenge` in a world of `world_size`, or nullptr if it passes.
const char* hello_fault(const std::string& secret, const std::string& challenge, int world_size,
                        const std::string& answered_challenge, const std::string& nonce,
                        const std::string& proof, int rank, const std::string& name);

// Compares in constant time, so a forger learns nothing from how long a rejection takes.
bool proofs_equal(const std::string& expected, const std::string& given);

}  // namespace ferry::rpc::auth
