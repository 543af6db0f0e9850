#include "worker/comm/gloo/full_mesh.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <exception>
#include <utility>

#include "common/logging.h"
#include "worker/comm/gloo/pair_addresses.h"

namespace lockstep::comm {

bool MentionsTimeout(const std::string& message) {
  std::string lower(message);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

namespace {

std::string Where(const GlooOptions& options) {
  return "gloo connect full mesh (rank " + std::to_string(options.rank) + " on " +
         options.listen_host + ")";
}

// What a libgloo exception during the connect means: a timeout, a transport fault a new attempt
// may mend (UNAVAILABLE), or a refusal no attempt mends.
Status ConnectError(const std::exception& e, const std::string& where, const Deadline& deadline) {
  const std::string message = where + ": " + e.what();
  if (MentionsTimeout(e.what()) || deadline.expired()) return DeadlineExceededError(message);
  if (dynamic_cast<const ::gloo::IoException*>(&e) != nullptr) return UnavailableError(message);
  return InternalError(message);
}

// Each rank sends every peer its rank and the attempt over their pair, and checks what every peer
// sent. A connection taken for a peer's that is not (above) ends, which fails the wait at once,
// or sends nothing the pair takes for a message, which ends the wait at kHelloTimeoutMs (the
// first timeout closes every pair of the rank, so the others fail at once). Either is a failure
// a new attempt may mend. After the address exchange every rank reaches this within a few store
// round trips of the others, so the bound is generous.
constexpr int64_t kHelloTimeoutMs = 10000;

// Rank 0 calls for no new attempt with less than this left of its deadline: the attempt could
// not finish, and the other ranks would wait out theirs in it.
constexpr int64_t kMinRetryMs = 1000;

Status Hello(TimeoutSettingContext& context, int attempt, const std::string& where,
             const Deadline& deadline) {
  const int rank = context.rank;
  const int size = context.size;
  const uint64_t kHelloSlot = ::gloo::Slot::build(0x41, 0);
  auto hello = [attempt](int from) {
    return (static_cast<uint64_t>(attempt) << 32) | static_cast<uint32_t>(from);
  };
  const auto timeout = std::chrono::milliseconds(
      std::max<int64_t>(1, std::min(deadline.remaining_ms(), kHelloTimeoutMs)));
  std::vector<uint64_t> sent(size, hello(rank)), received(size, 0);
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends(size), receives(size);
  // Every pair is greeted even after one fails (a pair whose connect failed throws at once), so
  // that no peer waits out the bound for this rank's greeting.
  Status first;
  auto note = [&](int peer, const std::string& what) {
    if (!first.ok()) return;
    const std::string message =
        where + ": greeting rank " + std::to_string(peer) + " over its connection: " + what;
    first = deadline.expired() ? DeadlineExceededError(message) : UnavailableError(message);
  };
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    try {
      sends[peer] = context.createUnboundBuffer(&sent[peer], sizeof(uint64_t));
      sends[peer]->send(peer, kHelloSlot);
      receives[peer] = context.createUnboundBuffer(&received[peer], sizeof(uint64_t));
      receives[peer]->recv(peer, kHelloSlot);
    } catch (const std::exception& e) {
      note(peer, e.what());
      receives[peer].reset();
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (receives[peer] == nullptr) continue;
    try {
      receives[peer]->waitRecv(timeout);
      sends[peer]->waitSend(timeout);
      if (received[peer] != hello(peer)) note(peer, "it answered as someone else");
    } catch (const std::exception& e) {
      note(peer, e.what());
    }
  }
  return first;
}

// One attempt: fresh pairs (fresh ports), addresses exchanged under the attempt's keys, pairs
// connected and greeted. A failed pair is in `connected`; a failure to make pairs or exchange addresses (no
// peer can have gone on without this rank's addresses) ends the attempt at once.
struct Attempt {
  FullMesh mesh;
  Status connected;
};

StatusOr<Attempt> TryOnce(const GlooOptions& options, rendezvous::KeyValueStore& store,
                          int attempt, const Deadline& deadline) {
  const std::string where = Where(options);
  Attempt result;
  std::vector<std::string> mine;
  try {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = options.listen_host;
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    result.mesh.context = std::make_shared<TimeoutSettingContext>(options.rank, options.size);
    // Bounds each pair's connect, which libgloo waits for five times its pair's timeout
    // (tcp::Pair::waitUntil): a fifth of what is left, so a peer that never connects ends the
    // wait at the deadline, not at five times it. Collectives set their own timeout per call.
    result.mesh.context->setTimeout(
        std::chrono::milliseconds(std::max<int64_t>(1, (deadline.remaining_ms() + 4) / 5)));
    mine = result.mesh.context->CreatePairs(device);
  } catch (const std::exception& e) {
    return ConnectError(e, where, deadline);
  }
  StatusOr<std::vector<std::string>> theirs =
      ExchangePairAddresses(store, options.rank, options.size, mine, attempt, deadline);
  if (!theirs.ok()) return theirs.status().WithContext("gloo connect full mesh");
  result.connected = result.mesh.context->ConnectPairs(*theirs, options, deadline);
  if (result.connected.code() != StatusCode::kDeadlineExceeded) {
    Status greeted = Hello(*result.mesh.context, attempt, where, deadline);
    if (result.connected.ok()) result.connected = greeted;
  }
  result.mesh.peer_addresses.resize(options.size);
  for (int peer = 0; peer < options.size; ++peer) {
    if (peer == options.rank) continue;
    const ::gloo::transport::tcp::Address address(
        std::vector<char>((*theirs)[peer].begin(), (*theirs)[peer].end()));
    result.mesh.peer_addresses[peer] = address.str();
    result.mesh.remote.push_back(address.getSockaddr());
    result.mesh.local.push_back(
        ::gloo::transport::tcp::Address(std::vector<char>(mine[peer].begin(), mine[peer].end()))
            .getSockaddr());
  }
  return result;
}

}  // namespace

std::vector<std::string> TimeoutSettingContext::CreatePairs(
    const std::shared_ptr<::gloo::transport::Device>& device) {
  device_ = device;
  transportContext_ = device->createContext(rank, size);
  transportContext_->setTimeout(getTimeout());
  std::vector<std::string> addresses(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> bytes = transportContext_->createPair(peer)->address().bytes();
    addresses[peer].assign(bytes.begin(), bytes.end());
  }
  return addresses;
}

Status TimeoutSettingContext::ConnectPairs(const std::vector<std::string>& theirs,
                                           const GlooOptions& options, const Deadline& deadline) {
  Status first;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    if (!first.ok() && deadline.expired()) break;
    try {
      transportContext_->getPair(peer)->connect(
          std::vector<char>(theirs[peer].begin(), theirs[peer].end()));
    } catch (const std::exception& e) {
      if (first.ok()) {
        first = ConnectError(e, Where(options) + ": pair with rank " + std::to_string(peer),
                             deadline);
      }
    }
  }
  return first;
}

StatusOr<FullMesh> ConnectFullMesh(const GlooOptions& options, rendezvous::KeyValueStore& store) {
  const Deadline deadline = Deadline::AfterMs(options.connect_timeout_ms);
  for (int attempt = 0;; ++attempt) {
    LOCKSTEP_ASSIGN_OR_RETURN(Attempt tried, TryOnce(options, store, attempt, deadline));
    // A timeout has spent the deadline: the peers learn of it when theirs passes.
    if (tried.connected.code() == StatusCode::kDeadlineExceeded) return tried.connected;
    // Rank 0 decides whether a failure is tried again (while attempts and time are left) and
    // every rank follows its verdict, so all of them try again or none does.
    const bool may_retry =
        attempt + 1 < kConnectAttempts && deadline.remaining_ms() > kMinRetryMs;
    Status everyone = AgreeOnConnect(store, options.rank, options.size, attempt, tried.connected,
                                     may_retry, deadline);
    if (everyone.ok()) return std::move(tried.mesh);
    const bool again = everyone.code() == StatusCode::kUnavailable;
    if (!again) return tried.connected.ok() ? everyone.WithContext(Where(options)) : tried.connected;
    LOCKSTEP_LOG(WARNING) << Where(options) << ": attempt " << attempt + 1 << " of "
                          << kConnectAttempts << " failed (" << everyone.message()
                          << "); connecting again on new ports";
  }
}

}  // namespace lockstep::comm
