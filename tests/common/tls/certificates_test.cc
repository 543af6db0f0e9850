// The rendezvous CA (common/tls): certificates OpenSSL verifies against the CA with the right
// names and purposes, a real TLS handshake between the rendezvous service and its client, HMAC
// against RFC 4231, and the CSPRNG.
#include "common/tls/certificates.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/rendezvous/client.h"
#include "common/rendezvous/server.h"

namespace lockstep::tls {
namespace {

struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

X509Ptr ParseCertificate(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* certificate = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return X509Ptr(certificate);
}

// X509_verify_cert of `leaf` with `ca` as the only trust anchor and the TLS server purpose;
// returns OpenSSL's verdict and its error string.
bool VerifiesAgainst(X509* leaf, X509* ca, std::string* error) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  X509_STORE_CTX_init(context, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(context, X509_PURPOSE_SSL_SERVER);
  const bool ok = X509_verify_cert(context) == 1;
  *error = X509_verify_cert_error_string(X509_STORE_CTX_get_error(context));
  X509_STORE_CTX_free(context);
  X509_STORE_free(store);
  return ok;
}

std::string CurveOf(const std::string& key_pem) {
  BIO* bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr) return "unparsable";
  char name[64] = {0};
  size_t size = 0;
  EVP_PKEY_get_utf8_string_param(key, "group", name, sizeof(name), &size);
  EVP_PKEY_free(key);
  return name;
}

TEST(CertificatesTest, CaIsASelfSignedP256CertificateAuthority) {
  auto ca = CreateCertificateAuthority("lockstep-rendezvous-ca", 30);
  ASSERT_TRUE(ca.ok()) << ca.status();
  X509Ptr certificate = ParseCertificate(ca->cert_pem);
  ASSERT_TRUE(certificate);
  EXPECT_EQ(X509_get_version(certificate.get()), X509_VERSION_3);
  EXPECT_EQ(X509_check_ca(certificate.get()), 1);
  EXPECT_EQ(X509_get_key_usage(certificate.get()) & KU_KEY_CERT_SIGN, KU_KEY_CERT_SIGN);
  EXPECT_EQ(CurveOf(ca->key_pem), "prime256v1");
  EXPECT_EQ(X509_get_signature_nid(certificate.get()), NID_ecdsa_with_SHA256);
  // Self-signed: it verifies as its own anchor.
  std::string error;
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, certificate.get());
  X509_STORE_CTX* context = X509_STORE_CTX_new();
  X509_STORE_CTX_init(context, store, certificate.get(), nullptr);
  EXPECT_EQ(X509_verify_cert(context), 1)
      << X509_verify_cert_error_string(X509_STORE_CTX_get_error(context));
  X509_STORE_CTX_free(context);
  X509_STORE_free(store);
  char common_name[128] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(certificate.get()), NID_commonName, common_name,
                            sizeof(common_name));
  EXPECT_STREQ(common_name, "lockstep-rendezvous-ca");
}

// A name longer than a CN may be (64 characters: a long job in a long namespace) is certified in
// subjectAltName, where verifiers look, and the CN says only "lockstep".
TEST(CertificatesTest, ANameTooLongForTheCommonNameIsStillCertified) {
  auto ca = CreateCertificateAuthority("lockstep-rendezvous-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  const std::string name = "a-parameter-server-job-with-a-long-name-ps-0.a-parameter-server-job-"
                           "with-a-long-name-ps.a-long-team-namespace.svc";
  ASSERT_GT(name.size(), 64u);
  auto serving = IssueServingCertificate(*ca, {"*.x.svc", name}, {}, 1);
  auto first_long = IssueServingCertificate(*ca, {name}, {}, 1);
  ASSERT_TRUE(serving.ok()) << serving.status();
  ASSERT_TRUE(first_long.ok()) << first_long.status();
  X509Ptr leaf = ParseCertificate(first_long->cert_pem);
  ASSERT_TRUE(leaf);
  EXPECT_EQ(X509_check_host(leaf.get(), name.c_str(), name.size(), 0, nullptr), 1);
  char common_name[128] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(leaf.get()), NID_commonName, common_name,
                            sizeof(common_name));
  EXPECT_STREQ(common_name, "lockstep");
}

TEST(CertificatesTest, ServingCertificateVerifiesAgainstItsCaWithEveryName) {
  auto ca = CreateCertificateAuthority("lockstep-rendezvous-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  auto serving = IssueServingCertificate(
      *ca, {"lockstep-rendezvous.lockstep-system.svc", "localhost"}, {"127.0.0.1", "::1"}, 7);
  ASSERT_TRUE(serving.ok()) << serving.status();
  X509Ptr ca_certificate = ParseCertificate(ca->cert_pem);
  X509Ptr leaf = ParseCertificate(serving->cert_pem);
  ASSERT_TRUE(ca_certificate && leaf);

  std::string error;
  EXPECT_TRUE(VerifiesAgainst(leaf.get(), ca_certificate.get(), &error)) << error;
  EXPECT_EQ(X509_check_ca(leaf.get()), 0);
  EXPECT_EQ(X509_check_purpose(leaf.get(), X509_PURPOSE_SSL_SERVER, 0), 1);
  EXPECT_EQ(CurveOf(serving->key_pem), "prime256v1");

  EXPECT_EQ(X509_check_host(leaf.get(), "lockstep-rendezvous.lockstep-system.svc", 0, 0, nullptr),
            1);
  EXPECT_EQ(X509_check_host(leaf.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf.get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf.get(), "::1", 0), 1);
  EXPECT_NE(X509_check_host(leaf.get(), "evil.example", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_ip_asc(leaf.get(), "10.0.0.1", 0), 1);

  // The validity window: from a little before now, for about 7 days.
  int days = 0, seconds = 0;
  ASSERT_EQ(ASN1_TIME_diff(&days, &seconds, X509_get0_notBefore(leaf.get()),
                           X509_get0_notAfter(leaf.get())),
            1);
  EXPECT_EQ(days, 7);
  EXPECT_LT(X509_cmp_current_time(X509_get0_notBefore(leaf.get())), 0);
}

TEST(CertificatesTest, ServingCertificateDoesNotVerifyAgainstAnotherCa) {
  auto ca = CreateCertificateAuthority("ca-one");
  auto other = CreateCertificateAuthority("ca-one");  // same name, different key
  ASSERT_TRUE(ca.ok() && other.ok());
  auto serving = IssueServingCertificate(*ca, {"localhost"}, {});
  ASSERT_TRUE(serving.ok()) << serving.status();
  X509Ptr other_certificate = ParseCertificate(other->cert_pem);
  X509Ptr leaf = ParseCertificate(serving->cert_pem);
  std::string error;
  EXPECT_FALSE(VerifiesAgainst(leaf.get(), other_certificate.get(), &error));
}

TEST(CertificatesTest, EachCertificateHasItsOwnKeyAndSerial) {
  auto ca = CreateCertificateAuthority("ca");
  ASSERT_TRUE(ca.ok());
  auto a = IssueServingCertificate(*ca, {"a"}, {});
  auto b = IssueServingCertificate(*ca, {"a"}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->key_pem, b->key_pem);
  X509Ptr first = ParseCertificate(a->cert_pem);
  X509Ptr second = ParseCertificate(b->cert_pem);
  EXPECT_NE(
      ASN1_INTEGER_cmp(X509_get0_serialNumber(first.get()), X509_get0_serialNumber(second.get())),
      0);
}

TEST(CertificatesTest, BadInputsAreInvalidArgument) {
  auto ca = CreateCertificateAuthority("ca");
  ASSERT_TRUE(ca.ok());
  auto not_an_ip = IssueServingCertificate(*ca, {"localhost"}, {"256.1.1.1"});
  EXPECT_EQ(not_an_ip.status().code(), StatusCode::kInvalidArgument) << not_an_ip.status();
  EXPECT_NE(not_an_ip.status().message().find("256.1.1.1"), std::string::npos);

  auto no_names = IssueServingCertificate(*ca, {}, {});
  EXPECT_EQ(no_names.status().code(), StatusCode::kInvalidArgument);

  KeyPair garbage{"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n", ca->key_pem};
  auto bad_ca = IssueServingCertificate(garbage, {"localhost"}, {});
  EXPECT_EQ(bad_ca.status().code(), StatusCode::kInvalidArgument) << bad_ca.status();

  auto other = CreateCertificateAuthority("other");
  ASSERT_TRUE(other.ok());
  KeyPair mismatched{ca->cert_pem, other->key_pem};
  auto wrong_key = IssueServingCertificate(mismatched, {"localhost"}, {});
  EXPECT_EQ(wrong_key.status().code(), StatusCode::kInvalidArgument) << wrong_key.status();
}

// The rendezvous service and client over TLS with certificates from this module, as the operator
// deploys them: the server presents serving + CA, workers trust the CA from their Secret.
class RendezvousTlsTest : public ::testing::Test {
 protected:
  static constexpr char kJob[] = "default/tls-job";
  static constexpr char kToken[] = "token-for-tls";

  void SetUp() override {
    auto ca = CreateCertificateAuthority("lockstep-rendezvous-ca");
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    auto serving = IssueServingCertificate(ca_, {"localhost"}, {"127.0.0.1"});
    ASSERT_TRUE(serving.ok()) << serving.status();
    rendezvous::ServerOptions options;
    options.tls_cert_pem = serving->cert_pem + ca_.cert_pem;
    options.tls_key_pem = serving->key_pem;
    auto server = rendezvous::RendezvousServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    rendezvous::JobConfig config;
    config.job = kJob;
    config.token = kToken;
    config.min_members = config.max_members = 2;
    ASSERT_TRUE(server_->AddJob(config).ok());
  }
  void TearDown() override {
    if (server_) server_->Shutdown(1000);
  }

  rendezvous::ClientOptions Client(const std::string& host, const std::string& member,
                                   const std::string& ca_pem) {
    rendezvous::ClientOptions options;
    options.address = host + ":" + std::to_string(server_->port());
    options.job = kJob;
    options.token = kToken;
    options.member_id = member;
    options.tls_ca_pem = ca_pem;
    options.rpc_timeout_ms = 3000;
    return options;
  }

  KeyPair ca_;
  std::unique_ptr<rendezvous::RendezvousServer> server_;
};

TEST_F(RendezvousTlsTest, WorkersTrustingTheCaJoinByAddressAndByName) {
  // Two members, one dialling the IP SAN, one the DNS SAN; the generation forms with both.
  auto by_ip = rendezvous::RendezvousClient::Connect(Client("127.0.0.1", "w-0", ca_.cert_pem));
  auto by_name = rendezvous::RendezvousClient::Connect(Client("localhost", "w-1", ca_.cert_pem));
  ASSERT_TRUE(by_ip.ok() && by_name.ok());
  StatusOr<rendezvous::Assignment> second = InternalError("not joined");
  std::thread other([&] { second = (*by_name)->Join(-1, 10000); });
  auto first = (*by_ip)->Join(-1, 10000);
  other.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->world_size, 2);
  EXPECT_EQ(first->generation, second->generation);
  std::set<int32_t> ranks = {first->rank, second->rank};
  EXPECT_EQ(ranks, (std::set<int32_t>{0, 1}));
}

TEST_F(RendezvousTlsTest, WorkerTrustingAnotherCaCannotReachTheService) {
  auto other = CreateCertificateAuthority("lockstep-rendezvous-ca");
  ASSERT_TRUE(other.ok());
  auto client = rendezvous::RendezvousClient::Connect(Client("127.0.0.1", "w-0", other->cert_pem));
  ASSERT_TRUE(client.ok());
  auto joined = (*client)->Join(-1, 1000);
  ASSERT_FALSE(joined.ok());
  // The handshake fails: gRPC reports the channel unavailable (or, if it kept retrying, the
  // deadline); never a rendezvous answer such as PERMISSION_DENIED.
  EXPECT_TRUE(joined.status().code() == StatusCode::kUnavailable ||
              joined.status().code() == StatusCode::kDeadlineExceeded)
      << joined.status();
}

TEST(HmacTest, MatchesRfc4231TestVectors) {
  struct Case {
    std::string key, data, hex;
  };
  const Case cases[] = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16"
       "\x17\x18\x19",
       std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The "
       "key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) EXPECT_EQ(HmacSha256Hex(c.key, c.data), c.hex) << c.data;
}

TEST(HmacTest, TokenDependsOnKeyAndJob) {
  const std::string token = HmacSha256Hex("master", "uid-1");
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(token, HmacSha256Hex("master", "uid-1"));
  EXPECT_NE(token, HmacSha256Hex("master", "uid-2"));
  EXPECT_NE(token, HmacSha256Hex("other", "uid-1"));
}

TEST(RandomBytesTest, ReturnsTheRequestedLengthAndDiffers) {
  auto a = RandomBytes(32);
  auto b = RandomBytes(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  auto empty = RandomBytes(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

}  // namespace
}  // namespace lockstep::tls
