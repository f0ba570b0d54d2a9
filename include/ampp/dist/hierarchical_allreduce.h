#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// DDP's reductions for ranks spread over several machines, each running several: the ranks of a machine sum
// through shared memory (SharedMemoryAllreduce), one leader per machine allreduces the machines' sums with
// Gloo, and each leader hands the total back to its machine through shared memory. Only the leaders touch
// the network, once per bucket, with one machine's worth of traffic instead of one rank's each. One machine:
// exactly shared_memory_allreduce_hook; one rank per machine: exactly allreduce_hook (Gloo).
#include <ampp/dist/comm_hooks.h>
#include <ampp/dist/process_group.h>

#include <string>
#include <vector>

namespace ampp::dist {

// What tells whether two processes can share memory: the host name, the kernel's boot id and the device
// of /dev/shm (two containers on one host with /dev/shm of their own differ). AMPP_MACHINE_ID, when set,
// replaces it (e.g. to keep ranks that could share memory apart).
std::string this_machine_id();

// How `world`'s ranks sit on machines. Machines are numbered by their lowest rank; that rank leads it.
struct MachineGroups {
  ProcessGroup world;
  ProcessGroup machine;  // this rank's machine (the whole world when there is one machine)
  ProcessGroup leaders;  // one rank per machine, in machine order; empty on the others and with one machine
  std::vector<std::vector<int>> ranks_of_machine;  // world ranks, ascending
  int machine_index = 0;                           // this rank's machine

  int machines() const { return static_cast<int>(ranks_of_machine.size()); }
  // The machine of world rank `rank`, and its rank within that machine.
  std::pair<int, int> place_of(int rank) const;
};

// A collective over `world`: every rank gives its machine id (this_machine_id() unless a test pretends);
// ranks with equal ids form a machine. Subgroups are made only when there are several machines.
MachineGroups group_by_machine(const ProcessGroup& world, const std::string& machine_id = this_machine_id());

// DDP's default reduction (divide by the world size, sum), through shared memory within each machine and
// Gloo between the machines' leaders. Every rank gets the leaders' bits. Sums are in rank order within a
// machine, then in Gloo's order across machines.
CommHook hierarchical_allreduce_hook(const MachineGroups& groups);

// DDP's per-forward buffer broadcast (register_buffer_broadcast) the same way: from the source to its
// machine's leader through shared memory, between leaders with Gloo, to each machine's ranks through shared
// memory. Bit-exact copies.
BufferBroadcast hierarchical_buffer_broadcast(const MachineGroups& groups);

}  // namespace ampp::dist
