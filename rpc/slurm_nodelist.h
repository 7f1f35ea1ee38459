// Slurm's compact lists of hosts, as SLURM_NODELIST gives them.
#pragma once

#include <string>

namespace ferry::rpc {

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace ferry::rpc
