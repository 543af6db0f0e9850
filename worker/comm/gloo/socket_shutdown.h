// Waking a thread blocked in a Gloo collective, which libgloo 0.5 cannot do itself.
//
// Context::closeConnections() closes this rank's sockets without signalling the buffers a
// collective waits on, so a thread of this rank already blocked in one stays blocked until the
// call's timeout (300 s by default in a TrainingJob); it returns early only if a peer's reset
// arrives while its socket is still open. When every rank of a generation aborts at once (the
// rendezvous ends it), a rank whose own abort lands first closes its sockets before its peers'
// resets arrive, and waits out its timeout: found on a real cluster, where a survivor of a
// killed worker sat out 5 minutes before rejoining.
//
// shutdown(2) of the socket, unlike close(2), leaves the descriptor in libgloo's event loop and
// makes it readable at end-of-file: the loop reads 0 bytes, the pair fails ("connection closed")
// and signals every buffer waiting on it, so the blocked collective throws at once. libgloo keeps
// its descriptors to itself, so they are found by address among the process's sockets.
//
// The other half: letting what this rank already sent arrive before its connections are reset.
// Context::closeConnections() closes with SO_LINGER 0, and a reset throws away whatever the
// kernel still holds unsent. A collective returns on a rank once its last bytes are handed to the
// kernel, not once the peer has them, so a rank that finished a collective and closed at once
// left a peer still receiving that collective's end with "connection reset by peer".
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <vector>

namespace lockstep::comm {

// shutdown(SHUT_RDWR) on every connected TCP socket of this process whose local address is one
// of `local` or whose peer address is one of `remote` (address and port compared). Listening
// sockets and everything else are left alone. Returns how many sockets were shut down.
int ShutdownConnectedSockets(const std::vector<sockaddr_storage>& local,
                             const std::vector<sockaddr_storage>& remote);

// Waits until everything this process wrote to those sockets has been acknowledged by the peer
// (SIOCOUTQ 0 on each), or until `timeout_ms` has passed. Returns whether it all was.
bool WaitUntilSentBytesAcknowledged(const std::vector<sockaddr_storage>& local,
                                    const std::vector<sockaddr_storage>& remote,
                                    int64_t timeout_ms);

// libgloo writes with writev(2), which raises SIGPIPE on a socket whose own end was shut down
// (an abort above) or whose peer reset it (a peer's abort). SIGPIPE's default action ends the
// process, so a survivor would die where the write should fail with EPIPE and the collective
// throw. Sets SIGPIPE to be ignored, unless the process already handles or ignores it.
// lockstep-worker ignores it in main, before any thread starts; this covers the other programs
// that create a communicator (the tests, a program linking the library).
void IgnoreSigpipeUnlessHandled();

}  // namespace lockstep::comm
