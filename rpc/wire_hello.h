// The handshake's Hello as Cap'n Proto carries it (rpc/wire.capnp), and the strings it holds:
// one encoding for the agents' frames (rpc/frame.cc) and the store's messages
// (rpc/store_protocol.cc), which open with the same handshake. Value functions.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "ferry/rpc/error.h"
#include "rpc/frame.h"
#include "rpc/wire.capnp.h"

namespace ferry::rpc {

inline capnp::Text::Reader wire_text(const std::string& s) {
  return capnp::Text::Reader(s.data(), s.size());
}

inline capnp::Data::Reader wire_bytes(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

inline std::string string_of(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

inline void write_hello(wire::Hello::Builder out, const std::string& name, int rank,
                        const Handshake& handshake) {
  out.setName(wire_text(name));
  out.setRank(rank);
  out.setStep(static_cast<wire::HandshakeStep>(handshake.step));
  out.setChallenge(wire_bytes(handshake.challenge));
  out.setNonce(wire_bytes(handshake.nonce));
  out.setProof(wire_bytes(handshake.proof));
}

// Throws Error(BadFrame) for a step this build does not know.
inline void read_hello(wire::Hello::Reader in, std::string* name, int* rank, Handshake* handshake) {
  auto step = static_cast<std::uint16_t>(in.getStep());
  if (step > static_cast<std::uint16_t>(HandshakeStep::Welcome)) {
    throw Error(ErrorKind::BadFrame, fmt::format("unknown handshake step {}", step));
  }
  *name = in.getName().cStr();
  *rank = in.getRank();
  handshake->step = static_cast<HandshakeStep>(step);
  handshake->challenge = string_of(in.getChallenge());
  handshake->nonce = string_of(in.getNonce());
  handshake->proof = string_of(in.getProof());
}

}  // namespace ferry::rpc
