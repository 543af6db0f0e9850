// What the Gloo communicator does to its own sockets (socket_shutdown.h), on real TCP connections
// over loopback: it finds them by address, shuts them down so that a reader sees their end, and
// before it resets them waits until the peer has acknowledged what was sent.
#include "worker/comm/gloo/socket_shutdown.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>
#include <vector>

namespace lockstep::comm {
namespace {

// One connected pair over 127.0.0.1, on a free port.
struct Connection {
  int sender = -1;
  int receiver = -1;
  sockaddr_storage sender_address{};
  ~Connection() {
    if (sender >= 0) close(sender);
    if (receiver >= 0) close(receiver);
  }
};

void Connect(Connection& connection) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  connection.sender = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(connection.sender, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  connection.receiver = accept(listener, nullptr, nullptr);
  close(listener);
  ASSERT_GE(connection.receiver, 0);
  length = sizeof(connection.sender_address);
  ASSERT_EQ(getsockname(connection.sender, reinterpret_cast<sockaddr*>(&connection.sender_address),
                        &length),
            0);
}

// Writes without blocking until the receiver's window and the sender's buffer are both full.
size_t FillUntilBlocked(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  std::vector<char> chunk(64 * 1024, 'x');
  size_t written = 0;
  for (;;) {
    const ssize_t n = write(fd, chunk.data(), chunk.size());
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: full
  }
  fcntl(fd, F_SETFL, flags);
  return written;
}

TEST(SocketShutdownTest, BytesThePeerHasNotReadAreNotAcknowledgedUntilItReads) {
  Connection connection;
  ASSERT_NO_FATAL_FAILURE(Connect(connection));
  const size_t written = FillUntilBlocked(connection.sender);
  ASSERT_GT(written, 0u);
  const std::vector<sockaddr_storage> mine = {connection.sender_address};
  EXPECT_FALSE(WaitUntilSentBytesAcknowledged(mine, {}, 200))
      << "the receiver has read nothing, so its full window holds bytes back";

  std::thread reader([&] {
    std::vector<char> buffer(64 * 1024);
    size_t read_bytes = 0;
    while (read_bytes < written) {
      const ssize_t n = read(connection.receiver, buffer.data(), buffer.size());
      if (n <= 0) break;
      read_bytes += static_cast<size_t>(n);
    }
  });
  EXPECT_TRUE(WaitUntilSentBytesAcknowledged(mine, {}, 30000));
  reader.join();
}

TEST(SocketShutdownTest, NothingSentMeansNothingToWaitFor) {
  Connection connection;
  ASSERT_NO_FATAL_FAILURE(Connect(connection));
  EXPECT_TRUE(WaitUntilSentBytesAcknowledged({connection.sender_address}, {}, 30000));
}

TEST(SocketShutdownTest, ShutdownReachesOnlyTheSocketsNamedAndTheirPeersReadTheEnd) {
  Connection named, other;
  ASSERT_NO_FATAL_FAILURE(Connect(named));
  ASSERT_NO_FATAL_FAILURE(Connect(other));
  EXPECT_EQ(ShutdownConnectedSockets({named.sender_address}, {}), 1);
  char byte = 0;
  EXPECT_EQ(read(named.receiver, &byte, 1), 0) << "the peer reads end-of-file";
  // The other connection still carries bytes both ways.
  ASSERT_EQ(write(other.sender, "a", 1), 1);
  ASSERT_EQ(read(other.receiver, &byte, 1), 1);
  EXPECT_EQ(byte, 'a');
}

}  // namespace
}  // namespace lockstep::comm
