#include <ampp/dist/shared_memory_allreduce.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <random>
#include <string>

namespace ampp::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kAlign = 64;  // a cache line: slots and the header never share one
constexpr int64_t kNameBytes = 64;

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Where broadcast_ puts each of `tensors` in a slot (each on a cache line); the last entry is the bytes needed.
std::vector<int64_t> slot_offsets(const std::vector<torch::Tensor>& tensors) {
  std::vector<int64_t> offsets{0};
  for (const auto& t : tensors) offsets.push_back(offsets.back() + aligned(t.numel() * t.element_size()));
  return offsets;
}

// The segment starts with the barrier's two counters, each in its own cache line.
struct alignas(kAlign) Header {
  alignas(kAlign) std::atomic<uint32_t> arrived{0};
  alignas(kAlign) std::atomic<uint32_t> generation{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the barrier needs lock-free 32-bit atomics");

long futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

std::string random_name() {
  std::random_device rd;
  return "/ampp-allreduce-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

// Rank 0's segment name, to every rank (Gloo broadcast of a fixed-size byte tensor).
std::string broadcast_name(const ProcessGroup& group, const std::string& name) {
  auto bytes = torch::zeros({kNameBytes}, torch::kByte);
  if (group.rank() == 0) std::memcpy(bytes.data_ptr(), name.data(), name.size());
  std::vector<torch::Tensor> io{bytes};
  group.c10d()->broadcast(io)->wait();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr()));
}

}  // namespace

struct SharedMemoryAllreduce::Segment {
  ProcessGroup group;
  int64_t capacity = 0;  // bytes per slot
  int64_t mapped_bytes = 0;
  void* base = MAP_FAILED;
  uint64_t calls = 0;

  Header& header() const { return *static_cast<Header*>(base); }
  // Two sets of slots, used in turn: a rank may write call k+1's data while another still reads call k's.
  char* slot(uint64_t call, int rank) const {
    const int64_t set = static_cast<int64_t>(call % 2) * group.size() + rank;
    return static_cast<char*>(base) + aligned(sizeof(Header)) + set * capacity;
  }
  void barrier(uint64_t call) const;
  ~Segment() {
    if (base != MAP_FAILED) ::munmap(base, static_cast<size_t>(mapped_bytes));
  }
};

// Every rank's arrival; the last one bumps the generation and wakes the others, who sleep in the kernel.
void SharedMemoryAllreduce::Segment::barrier(uint64_t call) const {
  Header& h = header();
  const uint32_t gen = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(group.size())) {
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.fetch_add(1, std::memory_order_release);
    futex(h.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  const auto deadline = Clock::now() + group.timeout();
  for (int spin = 0; spin < 200 && h.generation.load(std::memory_order_acquire) == gen; ++spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();  // a peer a few microseconds away is not worth a system call
#endif
  }
  while (h.generation.load(std::memory_order_acquire) == gen) {
    const auto left = deadline - Clock::now();
    TORCH_CHECK(left > Clock::duration::zero(), "ampp::dist shared-memory allreduce: rank ", group.rank(), " waited ",
                group.timeout().count(), " ms (the group's timeout) at call ", call + 1,
                " for the other ranks; one of them stopped, or the ranks call it in a different order");
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    futex(h.generation, FUTEX_WAIT, gen, &wait);  // returns at once if the generation already moved
  }
}

namespace {

// Rank 0 creates the segment; every rank maps it; rank 0 unlinks the name once all have. Returns the
// mapping (MAP_FAILED on this rank's failure) after learning whether every rank succeeded.
void* map_on_every_rank(const ProcessGroup& group, int64_t bytes) {
  std::string name = group.rank() == 0 ? random_name() : "";
  int fd = -1;
  if (group.rank() == 0) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ::ftruncate(fd, bytes) != 0) ::close(fd), fd = -1;
  }
  name = broadcast_name(group, fd >= 0 || group.rank() != 0 ? name : "");
  if (group.rank() != 0 && !name.empty()) fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  void* base =
      fd >= 0 ? ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) ::close(fd);
  auto failed = torch::tensor({base == MAP_FAILED ? 1 : 0}, torch::kInt);
  std::vector<torch::Tensor> io{failed};
  group.c10d()->allreduce(io)->wait();  // also: every rank has mapped it before the name goes
  if (group.rank() == 0 && !name.empty()) ::shm_unlink(name.c_str());
  if (failed.item<int>() == 0) return base;
  if (base != MAP_FAILED) ::munmap(base, static_cast<size_t>(bytes));
  TORCH_CHECK(false, "ampp::dist shared-memory allreduce: ", failed.item<int>(), " of ", group.size(),
              " ranks could not map rank 0's shared-memory segment of ", bytes,
              " bytes (ranks on several machines, or /dev/shm full or missing); use Gloo (allreduce_hook)");
}

}  // namespace

SharedMemoryAllreduce::SharedMemoryAllreduce(ProcessGroup group, int64_t capacity_bytes)
    : segment_(std::make_unique<Segment>()) {
  TORCH_CHECK(group, "SharedMemoryAllreduce needs an initialised process group");
  TORCH_CHECK(capacity_bytes > 0, "SharedMemoryAllreduce: capacity_bytes must be positive, got ", capacity_bytes);
  Segment& s = *segment_;
  s.group = std::move(group);
  s.capacity = aligned(capacity_bytes);
  s.mapped_bytes = aligned(sizeof(Header)) + 2 * s.group.size() * s.capacity;
  s.base = map_on_every_rank(s.group, s.mapped_bytes);
  if (s.group.rank() == 0) new (s.base) Header();  // the others touch it only after the next barrier
  s.group.barrier();
}

SharedMemoryAllreduce::~SharedMemoryAllreduce() = default;

int64_t SharedMemoryAllreduce::capacity_bytes() const { return segment_->capacity; }

int64_t SharedMemoryAllreduce::broadcast_bytes(const std::vector<torch::Tensor>& tensors) {
  return slot_offsets(tensors).back();
}

SharedMemoryAllreduce& sized_segment(std::unique_ptr<SharedMemoryAllreduce>& segment, const ProcessGroup& group,
                                     int64_t bytes, int64_t minimum_bytes) {
  if (!segment || segment->capacity_bytes() < bytes)
    segment = std::make_unique<SharedMemoryAllreduce>(group, std::max(bytes, minimum_bytes));
  return *segment;
}

void SharedMemoryAllreduce::sum_(torch::Tensor& tensor) {
  Segment& s = *segment_;
  TORCH_CHECK(tensor.is_contiguous() && tensor.device().is_cpu(),
              "SharedMemoryAllreduce::sum_ takes a contiguous CPU tensor");
  const int64_t bytes = tensor.numel() * tensor.element_size();
  TORCH_CHECK(bytes <= s.capacity, "SharedMemoryAllreduce::sum_: ", bytes, " bytes exceed the segment's ", s.capacity);
  const uint64_t call = s.calls++;
  std::memcpy(s.slot(call, s.group.rank()), tensor.data_ptr(), static_cast<size_t>(bytes));
  s.barrier(call);
  auto view = [&](int rank) { return torch::from_blob(s.slot(call, rank), tensor.sizes(), tensor.options()); };
  torch::NoGradGuard no_grad;
  // In rank order, so every rank computes the same bits; 16-bit floats accumulate in fp32 (one rounding).
  const bool widen = tensor.scalar_type() == torch::kBFloat16 || tensor.scalar_type() == torch::kHalf;
  if (!widen) {  // straight into the caller's tensor: no temporary, no copy back
    if (s.group.size() == 1) return;
    torch::add_out(tensor, view(0), view(1));
    for (int r = 2; r < s.group.size(); ++r) tensor.add_(view(r));
    return;
  }
  torch::Tensor total = view(0).to(torch::kFloat32);
  for (int r = 1; r < s.group.size(); ++r) total.add_(view(r));
  tensor.copy_(total);
}

void SharedMemoryAllreduce::broadcast_(const std::vector<torch::Tensor>& tensors, int root) {
  Segment& s = *segment_;
  TORCH_CHECK(root >= 0 && root < s.group.size(), "SharedMemoryAllreduce::broadcast_: root ", root,
              " is not a rank of this group of ", s.group.size());
  for (const auto& t : tensors) TORCH_CHECK(t.device().is_cpu(), "SharedMemoryAllreduce::broadcast_ takes CPU tensors");
  const auto offsets = slot_offsets(tensors);  // each tensor starts aligned for its dtype
  TORCH_CHECK(offsets.back() <= s.capacity, "SharedMemoryAllreduce::broadcast_: ", offsets.back(),
              " bytes exceed the segment's ", s.capacity);
  const uint64_t call = s.calls++;
  char* slot = s.slot(call, root);
  const bool sending = s.group.rank() == root;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; sending && i < tensors.size(); ++i) {
    const auto bytes = tensors[i].contiguous();
    std::memcpy(slot + offsets[i], bytes.data_ptr(), static_cast<size_t>(bytes.numel() * bytes.element_size()));
  }
  s.barrier(call);
  for (size_t i = 0; !sending && i < tensors.size(); ++i) {
    torch::Tensor target = tensors[i];  // shares the caller's storage: copy_ writes the caller's tensor
    target.copy_(torch::from_blob(slot + offsets[i], target.sizes(), target.options()));
  }
}

// Both move their data in pieces of at most a slot: the segment stays small whatever the tensors' size.
void SharedMemoryAllreduce::all_gather_(const torch::Tensor& mine, torch::Tensor& all) {
  Segment& s = *segment_;
  const int world = s.group.size();
  TORCH_CHECK(mine.is_contiguous() && all.is_contiguous() && mine.device().is_cpu() && all.device().is_cpu() &&
                  all.numel() == mine.numel() * world && all.scalar_type() == mine.scalar_type(),
              "SharedMemoryAllreduce::all_gather_ takes contiguous CPU tensors, `all` world times `mine`'s size");
  const int64_t bytes = mine.numel() * mine.element_size();
  const auto* in = static_cast<const char*>(mine.data_ptr());
  auto* out = static_cast<char*>(all.data_ptr());
  for (int64_t begin = 0; begin < bytes; begin += s.capacity) {
    const auto piece = static_cast<size_t>(std::min(s.capacity, bytes - begin));
    const uint64_t call = s.calls++;
    std::memcpy(s.slot(call, s.group.rank()), in + begin, piece);
    s.barrier(call);
    for (int r = 0; r < world; ++r) std::memcpy(out + r * bytes + begin, s.slot(call, r), piece);
  }
}

void SharedMemoryAllreduce::reduce_scatter_sum_(const torch::Tensor& input, torch::Tensor& output) {
  Segment& s = *segment_;
  const int world = s.group.size();
  TORCH_CHECK(input.is_contiguous() && input.device().is_cpu() && input.dim() == 2 && input.size(0) == world &&
                  output.is_contiguous() && output.numel() == input.size(1) &&
                  output.scalar_type() == input.scalar_type(),
              "SharedMemoryAllreduce::reduce_scatter_sum_ takes a contiguous CPU [world, n] input and an [n] output");
  const int64_t n = input.size(1), size = input.element_size();
  const int64_t columns = std::max<int64_t>(1, s.capacity / (world * size));  // per piece: [world, columns]
  TORCH_CHECK(world * size <= s.capacity, "SharedMemoryAllreduce::reduce_scatter_sum_: the segment's ", s.capacity,
              " bytes hold no column of ", world, " ranks");
  const auto* in = static_cast<const char*>(input.data_ptr());
  const bool widen = input.scalar_type() == torch::kBFloat16 || input.scalar_type() == torch::kHalf;
  torch::NoGradGuard no_grad;
  for (int64_t begin = 0; begin < n; begin += columns) {
    const int64_t width = std::min(columns, n - begin);
    const uint64_t call = s.calls++;
    char* slot = s.slot(call, s.group.rank());
    for (int r = 0; r < world; ++r)
      std::memcpy(slot + r * width * size, in + (r * n + begin) * size, static_cast<size_t>(width * size));
    s.barrier(call);
    auto row = [&](int r) {
      return torch::from_blob(s.slot(call, r) + s.group.rank() * width * size, {width}, input.options());
    };
    // In rank order, so every rank computes the same bits; 16-bit floats accumulate in fp32 (one rounding).
    torch::Tensor total = widen ? row(0).to(torch::kFloat32) : row(0).clone();
    for (int r = 1; r < world; ++r) total.add_(row(r));
    output.narrow(0, begin, width).copy_(total);
  }
}

CommHook shared_memory_allreduce_hook(ProcessGroup group) {
  auto segment = std::make_shared<std::unique_ptr<SharedMemoryAllreduce>>();
  return [group, segment](GradBucket& bucket) {
    torch::NoGradGuard no_grad;
    torch::Tensor buffer = bucket.buffer();
    // Every rank sees the same buckets in the same order, so all regrow at the same call.
    auto& shm = sized_segment(*segment, group, buffer.numel() * buffer.element_size(), kMinimumBucketSegment);
    buffer.div_(group.size());
    shm.sum_(buffer);
    return completed_future(buffer);
  };
}

BufferBroadcast shared_memory_buffer_broadcast(ProcessGroup group) {
  auto segment = std::make_shared<std::unique_ptr<SharedMemoryAllreduce>>();
  return [group, segment](const std::vector<torch::Tensor>& buffers, int source) {
    // Every rank broadcasts the same buffers, so all create (or regrow) the segment at the same call.
    sized_segment(*segment, group, SharedMemoryAllreduce::broadcast_bytes(buffers), kMinimumBufferSegment)
        .broadcast_(buffers, source);
  };
}

}  // namespace ampp::dist
