#include "workers.h"

namespace ampp::train::detail {

namespace {

// An integer environment variable; `fallback` when unset. A malformed value is an error, not 0.
int64_t env_int(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  const auto value = parse_int(text);
  TORCH_CHECK(value, "environment variable ", name, "='", text, "' is not an integer");
  return *value;
}

}  // namespace

Workers set_up_workers(const TrainOptions& o) {
  Workers w;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout() * 1000));
  const auto launch = launch_environment();
  if (launch.world_size_number() > 1)
    w.pg =
        dist::is_initialized() ? dist::default_group() : dist::init_process_group(dist::InitOptions().timeout(timeout));
  w.rank = w.pg ? w.pg.rank() : 0;
  w.world = w.pg ? w.pg.size() : 1;
  const int local_world = w.pg ? w.pg.local_size() : 1;
  w.threads = o.threads() > 0 ? o.threads() : static_cast<int>(env_int("OMP_NUM_THREADS", 0));
  if (w.threads <= 0) w.threads = threads_per_worker(local_world);
  set_compute_threads(w.threads);  // LibTorch and OpenBLAS pools alike (util/threads.h)
  w.restarted = launch.restart_count_number() > 0;
  return w;
}

// Runs `leader_work` on rank 0 only; every rank then learns whether it succeeded, so a failure
// there is an error on every rank instead of a hang in the next collective.
void on_leader_agreed(const Workers& w, const std::function<void()>& leader_work) {
  std::exception_ptr failure;
  if (w.leader()) {
    try {
      leader_work();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  auto failed = torch::tensor({failure ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(w.pg, failed);
  if (failure) std::rethrow_exception(failure);
  TORCH_CHECK(failed.item<double>() == 0, "rank 0 could not start the run (its error says why)");
}

// Before any work: the output folders are usable, and no other run writes into `out`.
std::unique_ptr<FolderLock> claim_outputs(const TrainOptions& o, const Workers& w) {
  std::unique_ptr<FolderLock> lock;
  on_leader_agreed(w, [&] {
    check_writable_folder(o.out(), "TrainOptions::out");
    if (!o.checkpoint_dir().empty()) check_writable_folder(o.checkpoint_dir(), "TrainOptions::checkpoint_dir");
    if (!o.tensorboard().empty()) check_writable_folder(o.tensorboard(), "TrainOptions::tensorboard");
    lock = std::make_unique<FolderLock>(o.out(), "TrainOptions::out");
  });
  return lock;
}

// This worker's device: TrainOptions::device, where "cuda" without an index means one GPU per local rank
// (torchrun's LOCAL_RANK), cuda:(local rank % GPUs), so that more workers than GPUs share them. It becomes
// the process's current CUDA device, which the collectives on CUDA tensors use.
torch::Device worker_device(const TrainOptions& o, const Workers& w) {
  torch::Device device = device_of(o);
  if (!device.is_cuda()) return device;
  if (!device.has_index()) {
    const int gpus = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>((w.pg ? w.pg.local_rank() : 0) % gpus));
  }
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
  return device;
}

namespace {

// Whether every worker has a GPU of its own (NCCL refuses two ranks on one device): all workers agree.
bool every_worker_has_its_own_gpu(const Run& run) {
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  const bool own = !device_of(run.o).has_index() && run.workers.pg.local_size() <= gpus;
  auto count = torch::tensor({own ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(run.workers.pg, count);
  return count.item<double>() == run.workers.world;
}

// DDP on GPUs: with one GPU per worker, each bucket's allreduce runs through NCCL on NCCL's stream while
// the backward goes on (torch.distributed's choice for CUDA tensors), over a subgroup of all the workers
// whose backend is NCCL; the run's own group stays Gloo for the host's sums. Workers that share a GPU, and
// --gloo-allreduce, reduce the CUDA gradients through Gloo (ampp's shared memory reads host memory).
dist::ProcessGroup gpu_gradient_group(Run& run) {
  const bool nccl =
      run.o.shared_memory_allreduce() && dist::is_backend_available("nccl") && every_worker_has_its_own_gpu(run);
  if (!nccl) {
    run.report.communication = fmt::format(
        "DDP: {} workers reduce CUDA gradients through Gloo ({})", run.workers.world,
        run.o.shared_memory_allreduce() ? "they share GPUs; NCCL needs one per worker" : "--gloo-allreduce");
    return run.workers.pg;
  }
  std::vector<int> everyone(static_cast<size_t>(run.workers.world));
  std::iota(everyone.begin(), everyone.end(), 0);
  run.report.communication =
      fmt::format("DDP: {} workers, one GPU each, reduce CUDA gradients through NCCL", run.workers.world);
  return dist::new_group(run.workers.pg, everyone, "nccl");
}

}  // namespace

// DDP over the workers; the workers of each machine reduce through shared memory, and only one per machine
// talks to the other machines.
void start_ddp(Run& run) {
  // Each .grad a slot of its bucket: the reduced bucket is the gradient, with no copy back into a separate
  // .grad per parameter (10 of the CNN's 73 copies per step, 0.7 of 2.3 ms in the operator profile).
  const auto options = dist::DistributedDataParallelOptions().gradient_as_bucket_view(true);
  if (run.device.is_cuda()) {
    run.device_group = gpu_gradient_group(run);
    run.ddp.emplace(run.model, *run.device_group, options);
    // SyncBatchNorm's statistics and ZeRO's updated parameters travel as DDP's gradients do (NCCL where each
    // worker has its GPU). ZeRO's checkpoint gathers (bytes) stay on the run's own group.
    for (const auto& module : run.model->modules())
      if (auto* bn = dynamic_cast<dist::SyncBatchNormImpl*>(module.get())) bn->options.process_group(*run.device_group);
    if (auto* zero = run.zero()) zero->set_broadcast_group(*run.device_group);
    return;
  }
  run.ddp.emplace(run.model, run.workers.pg, options);
  if (!run.o.shared_memory_allreduce()) {
    run.report.communication = fmt::format("DDP: {} workers reduce through Gloo (--gloo-allreduce)", run.workers.world);
    return;
  }
  const auto machines = dist::group_by_machine(run.workers.pg);
  run.ddp->register_comm_hook(dist::hierarchical_allreduce_hook(machines));
  run.ddp->register_buffer_broadcast(dist::hierarchical_buffer_broadcast(machines));
  run.report.communication =
      machines.machines() == 1
          ? fmt::format("DDP: {} workers on this machine reduce through shared memory", run.workers.world)
          : fmt::format(
                "DDP: {} workers on {} machines reduce through shared memory within each machine and "
                "through Gloo between one worker per machine",
                run.workers.world, machines.machines());
}

}  // namespace ampp::train::detail
