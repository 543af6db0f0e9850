// A sysfs tree the tests build: the files the kernel's drivers/infiniband/core/sysfs.c exposes
// under /sys/class/infiniband (Documentation/ABI/stable/sysfs-class-infiniband), with the same
// names and contents, so ReadRdmaDevicesFromSysfs reads it as it reads the real one.
//
//   FakeSysfs sysfs;
//   sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet",
//                 {{"fe80::1", "IB/RoCE v1", "net1"}, {"::ffff:10.0.0.5", "RoCE v2", "net1"}});
//   ReadRdmaDevicesFromSysfs(sysfs.root());
//
// Like the kernel, every index below the table length has a gids/<index> file (all zeros when
// unused, printed as %pI6 prints: eight groups of four hex digits); an unused entry has no
// readable type or ndev (the kernel's read fails with EINVAL; here the file is absent).
#pragma once

#include <arpa/inet.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep::rdma::testing {

struct FakeGid {
  std::string address;  // any inet_pton(AF_INET6) form; written in the kernel's %pI6 form
  std::string type;     // "IB/RoCE v1" | "RoCE v2"
  std::string netdev;   // "" for InfiniBand
};

class FakeSysfs {
 public:
  FakeSysfs() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "lockstep-sysfs-XXXXXX").string();
    root_ = mkdtemp(pattern.data());
  }
  ~FakeSysfs() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }

  // gid_table_length: the port's table size (mlx5 RoCE ports have 255, IB ports 128; a few are
  // enough here). Entries beyond `gids` are unused.
  void AddPort(const std::string& device, int port, const std::string& state,
               const std::string& link_layer, const std::vector<FakeGid>& gids,
               int gid_table_length = 8) {
    const std::filesystem::path dir =
        std::filesystem::path(root_) / "class/infiniband" / device / "ports" / std::to_string(port);
    Write(dir / "state", state);
    Write(dir / "phys_state", state.rfind("4:", 0) == 0 ? "5: LinkUp" : "3: Disabled");
    Write(dir / "link_layer", link_layer);
    Write(dir / "rate", "100 Gb/sec (4X EDR)");
    std::filesystem::create_directories(dir / "gid_attrs/types");
    std::filesystem::create_directories(dir / "gid_attrs/ndevs");
    for (int index = 0; index < gid_table_length; ++index) {
      const std::string name = std::to_string(index);
      if (index < static_cast<int>(gids.size())) {
        Write(dir / "gids" / name, KernelGidText(gids[index].address));
        Write(dir / "gid_attrs/types" / name, gids[index].type);
        if (!gids[index].netdev.empty()) {
          Write(dir / "gid_attrs/ndevs" / name, gids[index].netdev);
        }
      } else {
        Write(dir / "gids" / name, "0000:0000:0000:0000:0000:0000:0000:0000");
      }
    }
  }

 private:
  static void Write(const std::filesystem::path& path, const std::string& line) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << line << "\n";
  }

  // The kernel's %pI6: "fe80:0000:0000:0000:0202:c9ff:fe00:0001".
  static std::string KernelGidText(const std::string& address) {
    unsigned char raw[16] = {};
    inet_pton(AF_INET6, address.c_str(), raw);
    char text[40] = {};
    for (int i = 0; i < 8; ++i) {
      std::snprintf(text + i * 5, sizeof(text) - i * 5,
                    i == 7 ? "%02x%02x" : "%02x%02x:", raw[2 * i], raw[2 * i + 1]);
    }
    return text;
  }

  std::string root_;
};

}  // namespace lockstep::rdma::testing
