#include "common/tls/certificates.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>
#include <vector>

namespace lockstep::tls {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
template <typename T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, Deleter<T, Free>>;

using OwnedBio = Owned<BIO, BIO_free_all>;
using OwnedKey = Owned<EVP_PKEY, EVP_PKEY_free>;
using OwnedX509 = Owned<X509, X509_free>;
using OwnedName = Owned<X509_NAME, X509_NAME_free>;
using OwnedExtension = Owned<X509_EXTENSION, X509_EXTENSION_free>;
using OwnedBignum = Owned<BIGNUM, BN_free>;
using OwnedMac = Owned<EVP_MAC, EVP_MAC_free>;
using OwnedMacContext = Owned<EVP_MAC_CTX, EVP_MAC_CTX_free>;

void FreeGeneralNames(GENERAL_NAMES* names) { GENERAL_NAMES_free(names); }
using OwnedGeneralNames = Owned<GENERAL_NAMES, FreeGeneralNames>;

// Certificates start five minutes in the past: a verifier whose clock is a little behind the
// operator's would otherwise refuse a certificate issued a moment ago.
constexpr long kClockSkewSeconds = 300;

// INTERNAL with what `what` was doing and OpenSSL's queued errors (the queue is emptied, so the
// next failure does not report this one's).
Status OpenSslError(const std::string& what, StatusCode code = StatusCode::kInternal) {
  std::string message = what;
  unsigned long error;
  const char* separator = ": ";
  while ((error = ERR_get_error()) != 0) {
    char text[256];
    ERR_error_string_n(error, text, sizeof(text));
    message += separator;
    message += text;
    separator = "; ";
  }
  return Status(code, "tls: " + message);
}

StatusOr<OwnedKey> NewP256Key() {
  OwnedKey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (key == nullptr) return OpenSslError("generating a P-256 key");
  return key;
}

StatusOr<std::string> ToPem(X509* certificate) {
  OwnedBio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), certificate) != 1) {
    return OpenSslError("writing a certificate as PEM");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// PKCS#8 ("BEGIN PRIVATE KEY"), unencrypted: it lives in a Kubernetes Secret.
StatusOr<std::string> ToPem(EVP_PKEY* key) {
  OwnedBio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("writing a private key as PEM");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

StatusOr<OwnedName> NameWithCommonName(const std::string& common_name) {
  OwnedName name(X509_NAME_new());
  if (name == nullptr ||
      X509_NAME_add_entry_by_txt(name.get(), "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.data()),
                                 static_cast<int>(common_name.size()), -1, 0) != 1) {
    return OpenSslError("building the subject name \"" + common_name + "\"");
  }
  return name;
}

// A certificate with everything but extensions and signature: v3, a random 128-bit serial (RFC
// 5280 wants it unique per issuer; random avoids keeping a counter), validity from a little in
// the past, subject and public key.
StatusOr<OwnedX509> NewCertificate(X509_NAME* subject, const X509_NAME* issuer, EVP_PKEY* key,
                                   int valid_days) {
  OwnedX509 certificate(X509_new());
  if (certificate == nullptr) return OpenSslError("allocating a certificate");
  OwnedBignum serial(BN_new());
  // 127 bits and a top bit of 0: positive and at most 16 bytes as DER requires.
  if (serial == nullptr || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(certificate.get())) == nullptr) {
    return OpenSslError("drawing a serial number");
  }
  if (X509_set_version(certificate.get(), X509_VERSION_3) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(certificate.get()), -kClockSkewSeconds) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(certificate.get()), valid_days, 0, nullptr) == nullptr ||
      X509_set_subject_name(certificate.get(), subject) != 1 ||
      X509_set_issuer_name(certificate.get(), issuer) != 1 ||
      X509_set_pubkey(certificate.get(), key) != 1) {
    return OpenSslError("filling in the certificate");
  }
  return certificate;
}

// Adds an extension written in OpenSSL's configuration syntax (a fixed string of ours, never
// user input: names go through GENERAL_NAMES below).
Status AddExtension(X509* certificate, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
  OwnedExtension extension(X509V3_EXT_nconf_nid(nullptr, &context, nid, value));
  if (extension == nullptr || X509_add_ext(certificate, extension.get(), -1) != 1) {
    return OpenSslError(std::string("adding extension ") + OBJ_nid2sn(nid) + "=" + value);
  }
  return OkStatus();
}

Status Sign(X509* certificate, EVP_PKEY* key) {
  if (X509_sign(certificate, key, EVP_sha256()) <= 0) return OpenSslError("signing");
  return OkStatus();
}

// subjectAltName from DNS names and IP addresses, built as GENERAL_NAMES so that a name cannot
// smuggle in another entry (as a comma would in the configuration syntax).
Status AddSubjectAltNames(X509* certificate, const std::vector<std::string>& dns_names,
                          const std::vector<std::string>& ip_addresses) {
  OwnedGeneralNames names(sk_GENERAL_NAME_new_null());
  if (names == nullptr) return OpenSslError("allocating subjectAltName");
  for (const std::string& dns : dns_names) {
    if (dns.empty()) return InvalidArgumentError("tls: empty DNS name");
    ASN1_IA5STRING* text = ASN1_IA5STRING_new();
    if (text == nullptr || ASN1_STRING_set(text, dns.data(), static_cast<int>(dns.size())) != 1) {
      ASN1_IA5STRING_free(text);
      return OpenSslError("subjectAltName DNS " + dns);
    }
    GENERAL_NAME* name = GENERAL_NAME_new();
    if (name == nullptr) {
      ASN1_IA5STRING_free(text);
      return OpenSslError("allocating a GENERAL_NAME");
    }
    GENERAL_NAME_set0_value(name, GEN_DNS, text);
    sk_GENERAL_NAME_push(names.get(), name);
  }
  for (const std::string& ip : ip_addresses) {
    unsigned char bytes[16];
    int size = 0;
    if (inet_pton(AF_INET, ip.c_str(), bytes) == 1) {
      size = 4;
    } else if (inet_pton(AF_INET6, ip.c_str(), bytes) == 1) {
      size = 16;
    } else {
      return InvalidArgumentError("tls: \"" + ip + "\" is not an IPv4 or IPv6 address");
    }
    ASN1_OCTET_STRING* octets = ASN1_OCTET_STRING_new();
    if (octets == nullptr || ASN1_OCTET_STRING_set(octets, bytes, size) != 1) {
      ASN1_OCTET_STRING_free(octets);
      return OpenSslError("subjectAltName IP " + ip);
    }
    GENERAL_NAME* name = GENERAL_NAME_new();
    if (name == nullptr) {
      ASN1_OCTET_STRING_free(octets);
      return OpenSslError("allocating a GENERAL_NAME");
    }
    GENERAL_NAME_set0_value(name, GEN_IPADD, octets);
    sk_GENERAL_NAME_push(names.get(), name);
  }
  if (sk_GENERAL_NAME_num(names.get()) == 0) {
    return InvalidArgumentError("tls: a serving certificate needs a DNS name or an IP address");
  }
  if (X509_add1_ext_i2d(certificate, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) !=
      1) {
    return OpenSslError("adding subjectAltName");
  }
  return OkStatus();
}

}  // namespace

StatusOr<KeyPair> CreateCertificateAuthority(const std::string& common_name, int valid_days) {
  if (valid_days <= 0) return InvalidArgumentError("tls: valid_days must be > 0");
  LOCKSTEP_ASSIGN_OR_RETURN(OwnedKey key, NewP256Key());
  LOCKSTEP_ASSIGN_OR_RETURN(OwnedName name, NameWithCommonName(common_name));
  LOCKSTEP_ASSIGN_OR_RETURN(OwnedX509 certificate,
                            NewCertificate(name.get(), name.get(), key.get(), valid_days));
  X509* cert = certificate.get();
  // pathlen:0: this CA signs serving certificates only, never another CA.
  LOCKSTEP_RETURN_IF_ERROR(
      AddExtension(cert, cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  LOCKSTEP_RETURN_IF_ERROR(
      AddExtension(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature"));
  LOCKSTEP_RETURN_IF_ERROR(AddExtension(cert, cert, NID_subject_key_identifier, "hash"));
  LOCKSTEP_RETURN_IF_ERROR(AddExtension(cert, cert, NID_authority_key_identifier, "keyid:always"));
  LOCKSTEP_RETURN_IF_ERROR(Sign(cert, key.get()));
  KeyPair pair;
  LOCKSTEP_ASSIGN_OR_RETURN(pair.cert_pem, ToPem(cert));
  LOCKSTEP_ASSIGN_OR_RETURN(pair.key_pem, ToPem(key.get()));
  return pair;
}

StatusOr<KeyPair> IssueServingCertificate(const KeyPair& ca,
                                          const std::vector<std::string>& dns_names,
                                          const std::vector<std::string>& ip_addresses,
                                          int valid_days) {
  if (valid_days <= 0) return InvalidArgumentError("tls: valid_days must be > 0");
  OwnedBio cert_bio(BIO_new_mem_buf(ca.cert_pem.data(), static_cast<int>(ca.cert_pem.size())));
  OwnedX509 ca_cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (ca_cert == nullptr) {
    return OpenSslError("the CA certificate does not parse", StatusCode::kInvalidArgument);
  }
  OwnedBio key_bio(BIO_new_mem_buf(ca.key_pem.data(), static_cast<int>(ca.key_pem.size())));
  OwnedKey ca_key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (ca_key == nullptr) {
    return OpenSslError("the CA key does not parse", StatusCode::kInvalidArgument);
  }
  if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
    return OpenSslError("the CA key does not belong to the CA certificate",
                        StatusCode::kInvalidArgument);
  }

  LOCKSTEP_ASSIGN_OR_RETURN(OwnedKey key, NewP256Key());
  // The subject's CN is informational (verifiers match subjectAltName): the first name, unless
  // it is longer than the 64 characters X.509 allows a CN (a long job and namespace); the names
  // are all in subjectAltName, which has no such bound.
  constexpr size_t kMaxCommonName = 64;
  std::string common_name = !dns_names.empty()      ? dns_names.front()
                            : !ip_addresses.empty() ? ip_addresses.front()
                                                    : std::string("lockstep");
  if (common_name.size() > kMaxCommonName) common_name = "lockstep";
  LOCKSTEP_ASSIGN_OR_RETURN(OwnedName name, NameWithCommonName(common_name));
  LOCKSTEP_ASSIGN_OR_RETURN(
      OwnedX509 certificate,
      NewCertificate(name.get(), X509_get_subject_name(ca_cert.get()), key.get(), valid_days));
  X509* cert = certificate.get();
  LOCKSTEP_RETURN_IF_ERROR(AddSubjectAltNames(cert, dns_names, ip_addresses));
  LOCKSTEP_RETURN_IF_ERROR(AddExtension(cert, ca_cert.get(), NID_basic_constraints, "CA:FALSE"));
  // ECDSA keys sign the handshake: digitalSignature (keyEncipherment is for RSA key transport).
  LOCKSTEP_RETURN_IF_ERROR(
      AddExtension(cert, ca_cert.get(), NID_key_usage, "critical,digitalSignature"));
  LOCKSTEP_RETURN_IF_ERROR(AddExtension(cert, ca_cert.get(), NID_ext_key_usage, "serverAuth"));
  LOCKSTEP_RETURN_IF_ERROR(AddExtension(cert, ca_cert.get(), NID_subject_key_identifier, "hash"));
  LOCKSTEP_RETURN_IF_ERROR(
      AddExtension(cert, ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  LOCKSTEP_RETURN_IF_ERROR(Sign(cert, ca_key.get()));
  KeyPair pair;
  LOCKSTEP_ASSIGN_OR_RETURN(pair.cert_pem, ToPem(cert));
  LOCKSTEP_ASSIGN_OR_RETURN(pair.key_pem, ToPem(key.get()));
  return pair;
}

std::string HmacSha256Hex(const std::string& key, const std::string& message) {
  OwnedMac mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  OwnedMacContext context(mac ? EVP_MAC_CTX_new(mac.get()) : nullptr);
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_end()};
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t out_size = 0;
  // Only a broken OpenSSL installation (no default provider) fails here; an empty string then
  // matches no token, so nothing authenticates with it.
  if (context == nullptr ||
      EVP_MAC_init(context.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                   params) != 1 ||
      EVP_MAC_update(context.get(), reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1 ||
      EVP_MAC_final(context.get(), out, &out_size, sizeof(out)) != 1) {
    ERR_clear_error();
    return "";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(out_size * 2);
  for (size_t i = 0; i < out_size; ++i) {
    hex += kHex[out[i] >> 4];
    hex += kHex[out[i] & 15];
  }
  return hex;
}

StatusOr<std::string> RandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  if (bytes > 0 &&
      RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(bytes)) != 1) {
    return OpenSslError("drawing " + std::to_string(bytes) + " random bytes");
  }
  return out;
}

}  // namespace lockstep::tls
