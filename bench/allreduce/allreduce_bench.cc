// All-reduce bus bandwidth of one rank process, for bench/allreduce/run.sh.
//
//   allreduce_bench --impl lockstep|shm|hierarchical|gloo --rank R --size N --dir /tmp/x
//                   [--algo ring|bcube] [--sizes-mib 1,16,64] [--iters 20] [--warmup 5]
//                   [--hosts H0,H1,...] [--op allreduce|sendrecv]
//
// lockstep: Lockstep's Communicator (GlooCommunicator), bootstrapped through a file store.
// shm:      Lockstep's Communicator (ShmCommunicator, shared memory), the same way.
// hierarchical: Lockstep's shm+gloo Communicator (shared memory among the ranks of a host, Gloo
//           between hosts), the same way; needs --hosts.
// --hosts:  each rank's host address, by rank (bench/pods/run.sh runs ranks in network
//           namespaces): rank R listens on H<R>; without it every rank uses 127.0.0.1.
// gloo:     gloo::allreduce called directly with the algorithm given, on a context from
//           gloo's own FileStore; the same buffers and options are reused every iteration.
// Rank 0 prints one line per size: "<bytes> <seconds per op> <busbw GB/s>", where
// busbw = 2(n-1)/n * bytes / time (nccl-tests' definition) and time is the slowest rank's mean
// (each iteration ends on every rank together, so rank 0's mean is that).
// --op sendrecv (lockstep, shm; 2 ranks): each iteration the two ranks exchange `bytes` both
// ways at once with SendRecv, as two pipeline stages do in 1F1B's steady state; the third
// column is then bytes / time, each direction's bandwidth (bench/allreduce/sendrecv.sh).
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/allreduce/file_kv_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/hierarchical/hierarchical_communicator.h"
#include "worker/comm/shm/shm_communicator.h"

namespace {

struct Args {
  std::string impl = "lockstep";
  std::string algo = "ring";
  std::string op = "allreduce";
  std::string dir = "/tmp/lockstep-allreduce-bench";
  int rank = 0;
  int size = 2;
  int iters = 20;
  int warmup = 5;
  std::vector<double> sizes_mib = {1, 16, 64};
  std::vector<std::string> hosts;  // by rank; empty: loopback
};

Args Parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--impl")
      args.impl = value;
    else if (flag == "--algo")
      args.algo = value;
    else if (flag == "--op")
      args.op = value;
    else if (flag == "--dir")
      args.dir = value;
    else if (flag == "--rank")
      args.rank = std::atoi(value.c_str());
    else if (flag == "--size")
      args.size = std::atoi(value.c_str());
    else if (flag == "--iters")
      args.iters = std::atoi(value.c_str());
    else if (flag == "--warmup")
      args.warmup = std::atoi(value.c_str());
    else if (flag == "--hosts") {
      std::stringstream list(value);
      std::string item;
      while (std::getline(list, item, ',')) args.hosts.push_back(item);
    } else if (flag == "--sizes-mib") {
      args.sizes_mib.clear();
      std::stringstream list(value);
      std::string item;
      while (std::getline(list, item, ',')) args.sizes_mib.push_back(std::atof(item.c_str()));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return args;
}

template <typename Fn>
double MeanSeconds(int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

void Report(const Args& args, size_t bytes, double seconds) {
  if (args.rank != 0) return;
  const double busbw = (args.op == "sendrecv" ? 1.0 : 2.0 * (args.size - 1) / args.size) *
                       bytes / seconds / 1e9;
  std::printf("%zu %.6f %.3f\n", bytes, seconds, busbw);
  std::fflush(stdout);
}

int RunLockstep(const Args& args) {
  using namespace lockstep;
  bench::FileKeyValueStore store(args.dir);
  StatusOr<std::unique_ptr<comm::Communicator>> communicator = InternalError("no backend");
  if (args.impl == "shm") {
    comm::ShmOptions options;
    options.rank = args.rank;
    options.size = args.size;
    options.job_name = "allreduce-bench";
    communicator = comm::CreateShmCommunicator(options, store);
  } else if (args.impl == "hierarchical") {
    comm::HierarchicalOptions options;
    options.rank = args.rank;
    std::optional<comm::HostLayout> layout = comm::LayoutByHost(args.hosts);
    if (layout) options.layout = *std::move(layout);  // else refused as an empty layout
    options.host = args.hosts.at(static_cast<size_t>(args.rank));
    options.job_name = "allreduce-bench";
    communicator = comm::CreateHierarchicalCommunicator(options, store);
  } else {
    comm::GlooOptions options;
    options.rank = args.rank;
    options.size = args.size;
    if (!args.hosts.empty()) options.listen_host = args.hosts.at(static_cast<size_t>(args.rank));
    communicator = comm::CreateGlooCommunicator(options, store);
  }
  if (!communicator.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", args.rank, communicator.status().ToString().c_str());
    return 1;
  }
  for (double mib : args.sizes_mib) {
    const size_t count = static_cast<size_t>(mib * (1 << 20)) / sizeof(float);
    std::vector<float> data(count, 1.0f), received(count);
    const int peer = 1 - args.rank;
    Status status;
    const double seconds = MeanSeconds(args.warmup, args.iters, [&] {
      if (!status.ok()) return;
      if (args.op == "sendrecv") {
        status = (*communicator)
                     ->SendRecv(data.data(), count * sizeof(float), peer, received.data(),
                                count * sizeof(float), peer, 60000);
      } else {
        status = (*communicator)
                     ->AllReduce(data.data(), count, comm::DataType::kFloat32, comm::ReduceOp::kSum,
                                 60000);
      }
    });
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", args.rank, status.ToString().c_str());
      return 1;
    }
    Report(args, count * sizeof(float), seconds);
  }
  return 0;
}

int RunGloo(const Args& args) {
  gloo::rendezvous::FileStore file_store(args.dir);
  gloo::rendezvous::PrefixStore store("raw-gloo", file_store);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(args.rank, args.size);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(store, device);
  for (double mib : args.sizes_mib) {
    const size_t count = static_cast<size_t>(mib * (1 << 20)) / sizeof(float);
    std::vector<float> data(count, 1.0f);
    gloo::AllreduceOptions opts(context);
    opts.setOutput(data.data(), count);
    opts.setAlgorithm(args.algo == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                           : gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    uint32_t tag = 0;
    const double seconds = MeanSeconds(args.warmup, args.iters, [&] {
      opts.setTag(tag++);
      gloo::allreduce(opts);
    });
    Report(args, count * sizeof(float), seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  if (args.op != "allreduce" && !(args.op == "sendrecv" && args.size == 2 &&
                                  (args.impl == "lockstep" || args.impl == "shm"))) {
    std::fprintf(stderr, "--op %s: allreduce, or sendrecv with --impl lockstep|shm and 2 ranks\n",
                 args.op.c_str());
    return 2;
  }
  try {
    if (args.impl == "gloo") return RunGloo(args);
    return RunLockstep(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", args.rank, e.what());
    return 1;
  }
}
