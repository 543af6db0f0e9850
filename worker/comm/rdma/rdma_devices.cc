// The result types and the sysfs reader (rdma_devices.h). The libibverbs probe is in
// rdma_devices_verbs.cc, or rdma_devices_no_verbs.cc where libibverbs was not found at build time.
#include "worker/comm/rdma/rdma_devices.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace lockstep::rdma {
namespace {

namespace fs = std::filesystem;

// The file's first line without the trailing newline; false when it cannot be read (an unused
// GID entry's type file fails with EINVAL).
bool ReadFirstLine(const fs::path& path, std::string* line) {
  std::ifstream in(path);
  if (!in) return false;
  if (!std::getline(in, *line)) return false;
  while (!line->empty() && (line->back() == '\n' || line->back() == ' ')) line->pop_back();
  return true;
}

// Directory entries whose names are non-negative integers, ascending ("1", "2", ..., "10").
std::vector<int> NumericEntries(const fs::path& directory) {
  std::vector<int> numbers;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    numbers.push_back(std::atoi(name.c_str()));
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

RdmaLinkLayer ParseLinkLayer(const std::string& text) {
  if (text == "InfiniBand") return RdmaLinkLayer::kInfiniBand;
  if (text == "Ethernet") return RdmaLinkLayer::kEthernet;
  return RdmaLinkLayer::kUnknown;
}

// "4: ACTIVE" -> 4 and "ACTIVE".
bool ParsePortState(const std::string& text, int* state, std::string* name) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string number = text.substr(0, colon);
  if (number.find_first_not_of("0123456789") != std::string::npos) return false;
  *state = std::atoi(number.c_str());
  size_t start = colon + 1;
  while (start < text.size() && text[start] == ' ') ++start;
  *name = text.substr(start);
  return true;
}

bool IsZero(const std::array<uint8_t, 16>& raw) {
  return std::all_of(raw.begin(), raw.end(), [](uint8_t byte) { return byte == 0; });
}

}  // namespace

const char* ToString(RdmaLinkLayer link_layer) {
  switch (link_layer) {
    case RdmaLinkLayer::kInfiniBand:
      return "InfiniBand";
    case RdmaLinkLayer::kEthernet:
      return "Ethernet (RoCE)";
    case RdmaLinkLayer::kUnknown:
      break;
  }
  return "unknown link layer";
}

const char* ToString(RdmaGidType type) {
  switch (type) {
    case RdmaGidType::kIb:
      return "IB";
    case RdmaGidType::kRoceV1:
      return "RoCE v1";
    case RdmaGidType::kRoceV2:
      return "RoCE v2";
  }
  return "?";
}

bool RdmaGid::IsIpv4Mapped() const {
  for (int i = 0; i < 10; ++i) {
    if (raw[i] != 0) return false;
  }
  return raw[10] == 0xff && raw[11] == 0xff;
}

std::string RdmaGid::Address() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (IsIpv4Mapped()) {
    inet_ntop(AF_INET, raw.data() + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, raw.data(), text, sizeof(text));
  }
  return text;
}

std::vector<RdmaGid> ReadGidTableFromSysfs(const std::string& sysfs_root, const std::string& device,
                                           int port, RdmaLinkLayer link_layer) {
  const fs::path port_dir =
      fs::path(sysfs_root) / "class/infiniband" / device / "ports" / std::to_string(port);
  std::vector<RdmaGid> gids;
  for (int index : NumericEntries(port_dir / "gids")) {
    const std::string name = std::to_string(index);
    std::string gid_text;
    std::string type_text;
    if (!ReadFirstLine(port_dir / "gids" / name, &gid_text)) continue;
    RdmaGid gid;
    gid.index = index;
    if (inet_pton(AF_INET6, gid_text.c_str(), gid.raw.data()) != 1 || IsZero(gid.raw)) continue;
    // No type file (kernels before 4.5 had none) is IB/RoCE v1, as rdma-core assumes.
    if (ReadFirstLine(port_dir / "gid_attrs/types" / name, &type_text)) {
      if (type_text == "RoCE v2") {
        gid.type = RdmaGidType::kRoceV2;
      } else if (type_text == "IB/RoCE v1") {
        gid.type = RdmaGidType::kIb;
      } else {
        continue;  // a type this code does not know: not an entry to choose
      }
    } else if (fs::exists(port_dir / "gid_attrs/types")) {
      continue;  // the type of an unused entry fails to read
    }
    if (gid.type == RdmaGidType::kIb && link_layer == RdmaLinkLayer::kEthernet) {
      gid.type = RdmaGidType::kRoceV1;
    }
    ReadFirstLine(port_dir / "gid_attrs/ndevs" / name, &gid.netdev);
    gids.push_back(std::move(gid));
  }
  return gids;
}

StatusOr<std::vector<RdmaDevice>> ReadRdmaDevicesFromSysfs(const std::string& sysfs_root) {
  const fs::path class_dir = fs::path(sysfs_root) / "class/infiniband";
  std::vector<RdmaDevice> devices;
  std::error_code error;
  if (!fs::exists(class_dir, error)) return devices;
  std::vector<std::string> names;
  for (fs::directory_iterator it(class_dir, error), end; !error && it != end; it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  if (error) {
    return InternalError("read " + class_dir.string() + ": " + error.message());
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    RdmaDevice device;
    device.name = name;
    const fs::path ports_dir = class_dir / name / "ports";
    for (int number : NumericEntries(ports_dir)) {
      const fs::path port_dir = ports_dir / std::to_string(number);
      RdmaPort port;
      port.number = number;
      std::string state_text;
      std::string link_layer_text;
      if (!ReadFirstLine(port_dir / "state", &state_text) ||
          !ParsePortState(state_text, &port.state, &port.state_name)) {
        device.open_error = "cannot read " + (port_dir / "state").string();
        continue;
      }
      // Kernels before link_layer existed had InfiniBand only.
      port.link_layer = ReadFirstLine(port_dir / "link_layer", &link_layer_text)
                            ? ParseLinkLayer(link_layer_text)
                            : RdmaLinkLayer::kInfiniBand;
      port.gids = ReadGidTableFromSysfs(sysfs_root, name, number, port.link_layer);
      device.ports.push_back(std::move(port));
    }
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace lockstep::rdma
