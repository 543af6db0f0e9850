// Parameter-server traffic over TLS (ShardServerOptions::tls_*, PsClientOptions::tls_ca_pem), as
// the operator and `lockstep run` set it up: a server with a certificate from the job's CA
// answers a client that trusts that CA and carries the servers' token, and nobody else: not a
// plaintext client, not a client trusting another CA, not a client with the rendezvous token.
// And what the environment gives a server and a worker (ps_credentials.h).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/tls/certificates.h"
#include "tests/support/process/scratch_files.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_credentials.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

constexpr char kJob[] = "default/ctr";
constexpr char kPsToken[] = "ps-token";

class PsTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ca = tls::CreateCertificateAuthority("job ca", 1);
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    auto serving = tls::IssueServingCertificate(ca_, {"localhost"}, {"127.0.0.1"}, 1);
    ASSERT_TRUE(serving.ok()) << serving.status();
    ShardServerOptions options;
    options.job = kJob;
    options.token = kPsToken;
    TableSpec table;
    table.name = "emb";
    table.rows = 100;
    table.dim = 2;
    options.tables = {table};
    options.tls_cert_pem = serving->cert_pem + ca_.cert_pem;
    options.tls_key_pem = serving->key_pem;
    auto server = ShardServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  // A refused handshake is retried until the timeout, as a server not yet up is: 1 s is plenty.
  Status PullWith(const std::string& token, const std::string& ca_pem, int64_t timeout_ms = 1000) {
    PsClientOptions options;
    options.servers = {"127.0.0.1:" + std::to_string(server_->port())};
    options.job = kJob;
    options.token = token;
    options.tls_ca_pem = ca_pem;
    options.timeout_ms = timeout_ms;
    auto client = PsClient::Connect(options);
    if (!client.ok()) return client.status();
    std::vector<float> out(4);
    return (*client)->Pull("emb", 2, {0, 1}, out.data());
  }

  tls::KeyPair ca_;
  std::unique_ptr<ShardServer> server_;
};

TEST_F(PsTlsTest, AClientTrustingTheJobsCaWithTheServersTokenIsAnswered) {
  Status pulled = PullWith(kPsToken, ca_.cert_pem, 10000);
  EXPECT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(server_->stats().pulls, 1u);
}

TEST_F(PsTlsTest, APlaintextClientIsRefusedAndReachesNoTable) {
  Status pulled = PullWith(kPsToken, "");
  EXPECT_FALSE(pulled.ok());
  std::cout << "plaintext client: " << pulled << "\n";
  EXPECT_EQ(server_->stats().pulls, 0u);
}

TEST_F(PsTlsTest, AClientTrustingAnotherCaIsRefused) {
  auto other = tls::CreateCertificateAuthority("another ca", 1);
  ASSERT_TRUE(other.ok());
  Status pulled = PullWith(kPsToken, other->cert_pem);
  EXPECT_FALSE(pulled.ok());
  std::cout << "client trusting another CA: " << pulled << "\n";
  EXPECT_EQ(server_->stats().pulls, 0u);
}

TEST_F(PsTlsTest, AClientWithTheRendezvousTokenInsteadOfTheServersIsRefused) {
  Status pulled = PullWith("the-rendezvous-token", ca_.cert_pem, 10000);
  EXPECT_EQ(pulled.code(), StatusCode::kNotFound) << pulled;
  EXPECT_EQ(server_->stats().pulls, 0u);
}

// The environment of a server and a worker, as ps_credentials.h reads it.
class PsCredentialsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {"LOCKSTEP_PS_TOKEN", "LOCKSTEP_JOB_TOKEN", "LOCKSTEP_PS_TLS_CERT_FILE",
                             "LOCKSTEP_PS_TLS_KEY_FILE", "LOCKSTEP_PS_CA_FILE"}) {
      unsetenv(name);
    }
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    testing::WriteFile(path, text);
    return path;
  }
  std::string dir_ = testing::MakeTempDir("ps-credentials");
};

TEST_F(PsCredentialsTest, AServerGetsItsTokenAndBothTlsFiles) {
  auto ca = tls::CreateCertificateAuthority("job ca", 1);
  ASSERT_TRUE(ca.ok());
  setenv("LOCKSTEP_PS_TOKEN", "ps", 1);
  setenv("LOCKSTEP_JOB_TOKEN", "rendezvous", 1);
  setenv("LOCKSTEP_PS_TLS_CERT_FILE", Write("tls.crt", ca->cert_pem).c_str(), 1);
  setenv("LOCKSTEP_PS_TLS_KEY_FILE", Write("tls.key", ca->key_pem).c_str(), 1);
  auto server = PsServerCredentialsFromEnvironment();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->token, "ps");
  EXPECT_EQ(server->tls_cert_pem, ca->cert_pem);
  EXPECT_EQ(server->tls_key_pem, ca->key_pem);
  setenv("LOCKSTEP_PS_CA_FILE", Write("ca.crt", ca->cert_pem).c_str(), 1);
  auto client = PsClientCredentialsFromEnvironment();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->token, "ps");
  EXPECT_EQ(client->tls_ca_pem, ca->cert_pem);
}

TEST_F(PsCredentialsTest, WithoutItsOwnTokenAPodOfAnEarlierOperatorUsesTheJobsAndNoneIsRefused) {
  setenv("LOCKSTEP_JOB_TOKEN", "rendezvous", 1);
  auto server = PsServerCredentialsFromEnvironment();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->token, "rendezvous");
  EXPECT_TRUE(server->tls_cert_pem.empty());
  unsetenv("LOCKSTEP_JOB_TOKEN");
  auto none = PsClientCredentialsFromEnvironment();
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("LOCKSTEP_PS_TOKEN is not set"), std::string::npos);
}

TEST_F(PsCredentialsTest, BadTlsFilesAreRefusedNamingTheVariableAndTheFile) {
  setenv("LOCKSTEP_PS_TOKEN", "ps", 1);
  setenv("LOCKSTEP_PS_TLS_CERT_FILE", (dir_ + "/missing.crt").c_str(), 1);
  auto missing = PsServerCredentialsFromEnvironment();
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("LOCKSTEP_PS_TLS_CERT_FILE: cannot read " + dir_ +
                                            "/missing.crt"),
            std::string::npos)
      << missing.status();

  auto ca = tls::CreateCertificateAuthority("job ca", 1);
  ASSERT_TRUE(ca.ok());
  setenv("LOCKSTEP_PS_TLS_CERT_FILE", Write("tls.crt", ca->cert_pem).c_str(), 1);
  auto alone = PsServerCredentialsFromEnvironment();
  EXPECT_NE(alone.status().message().find("give both (TLS) or neither"), std::string::npos)
      << alone.status();

  setenv("LOCKSTEP_PS_TLS_KEY_FILE", Write("not-a-key", ca->cert_pem).c_str(), 1);
  auto not_key = PsServerCredentialsFromEnvironment();
  EXPECT_NE(not_key.status().message().find("holds no PEM private key"), std::string::npos)
      << not_key.status();

  setenv("LOCKSTEP_PS_CA_FILE", Write("ca.txt", "hello").c_str(), 1);
  auto not_pem = PsClientCredentialsFromEnvironment();
  EXPECT_NE(not_pem.status().message().find("LOCKSTEP_PS_CA_FILE: " + dir_ +
                                            "/ca.txt holds no PEM certificate"),
            std::string::npos)
      << not_pem.status();
}

}  // namespace
}  // namespace lockstep::ps
