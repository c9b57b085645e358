// A self-signed TLS certificate for tests, made with OpenSSL (no files shipped, nothing to expire).
#pragma once

#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <functional>
#include <string>

namespace weft::testing {

// A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files in `dir`.
struct TestCertificate {
  std::string cert, key;
};

inline void WritePem(const std::string& path, const std::function<int(FILE*)>& write) {
  FILE* file = std::fopen(path.c_str(), "w");
  REQUIRE(file != nullptr);
  REQUIRE(write(file) == 1);
  std::fclose(file);
}

inline TestCertificate MakeCertificate(const std::string& dir, const std::string& name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  REQUIRE(key != nullptr);
  X509* x509 = X509_new();
  X509_set_version(x509, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x509), 1);
  X509_gmtime_adj(X509_getm_notBefore(x509), -60);
  X509_gmtime_adj(X509_getm_notAfter(x509), 3600);
  X509_set_pubkey(x509, key);
  X509_NAME* subject = X509_get_subject_name(x509);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(x509, subject);
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, x509, x509, nullptr, nullptr, 0);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &context, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  REQUIRE(san != nullptr);
  X509_add_ext(x509, san, -1);
  X509_EXTENSION_free(san);
  REQUIRE(X509_sign(x509, key, EVP_sha256()) > 0);
  TestCertificate out{dir + "/" + name + ".crt", dir + "/" + name + ".key"};
  WritePem(out.cert, [&](FILE* f) { return PEM_write_X509(f, x509); });
  WritePem(out.key, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  X509_free(x509);
  EVP_PKEY_free(key);
  return out;
}

}  // namespace weft::testing
