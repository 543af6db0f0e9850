// Base64 as Kubernetes Secrets and kubeconfigs carry bytes: RFC 4648's vectors both ways, the
// wrapped values kubeconfigs hold, and text that is not base64 refused.
#include "common/base64.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace lockstep {
namespace {

TEST(Base64Test, TheRfc4648VectorsEncodeAndDecodeBack) {
  const std::vector<std::pair<std::string, std::string>> vectors = {{"", ""},
                                                                    {"f", "Zg=="},
                                                                    {"fo", "Zm8="},
                                                                    {"foo", "Zm9v"},
                                                                    {"foob", "Zm9vYg=="},
                                                                    {"fooba", "Zm9vYmE="},
                                                                    {"foobar", "Zm9vYmFy"}};
  for (const auto& [bytes, text] : vectors) {
    EXPECT_EQ(Base64Encode(bytes), text) << bytes;
    StatusOr<std::string> decoded = Base64Decode(text);
    ASSERT_TRUE(decoded.ok()) << text << ": " << decoded.status();
    EXPECT_EQ(*decoded, bytes) << text;
  }
}

TEST(Base64Test, EveryByteValueRoundTrips) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  for (size_t length : {size_t{1}, size_t{2}, size_t{3}, size_t{255}, size_t{256}}) {
    const std::string part = bytes.substr(0, length);
    StatusOr<std::string> decoded = Base64Decode(Base64Encode(part));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, part) << length << " bytes";
  }
}

TEST(Base64Test, WhitespaceInsideAWrappedValueIsSkipped) {
  StatusOr<std::string> decoded = Base64Decode("Zm9v\nYmFy\r\n Zm9v\tYg==\n");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, "foobarfoob");
}

TEST(Base64Test, TextThatIsNotBase64IsRefused) {
  for (const std::string text :
       {"Zm9", "Zm9vY", "Zm9-", "Zm9_", "Z===", "Zg=a", "Zg==Zg==", "====", "Zm9v!A=="}) {
    StatusOr<std::string> decoded = Base64Decode(text);
    ASSERT_FALSE(decoded.ok()) << text << " decoded to " << *decoded;
    EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(decoded.status().message().find("not base64"), std::string::npos) << decoded.status();
  }
}

}  // namespace
}  // namespace lockstep
