#include "api/tls.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace kc::api {
namespace {

struct Freer {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Freer>;
using Cert = std::unique_ptr<X509, Freer>;
using Bio = std::unique_ptr<BIO, Freer>;

Status OpensslError(std::string_view what) {
  return InternalError(fmt::format("tls: {} failed (OpenSSL)", what));
}

Result<Key> NewKey() {
  Key k(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!k) return OpensslError("key generation");
  return k;
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer_key` as `issuer` (itself when null).
Result<Cert> NewCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                     int days, const std::vector<std::pair<int, std::string>>& extensions) {
  Cert c(X509_new());
  if (!c) return OpensslError("certificate");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpensslError("serial number");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(c.get()));
  BN_free(bn);
  if (!serial_ok) return OpensslError("serial number");
  X509_set_version(c.get(), 2);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(c.get(), key);
  X509_NAME* name = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>("Kuangchao"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : c.get();
  X509_set_issuer_name(c.get(), X509_get_subject_name(signer));
  for (const auto& [nid, value] : extensions) {
    if (!AddExtension(c.get(), signer, nid, value)) return OpensslError("certificate extension");
  }
  if (X509_sign(c.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) {
    return OpensslError("signing");
  }
  return c;
}

Result<std::string> Pem(X509* cert, EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio) return OpensslError("PEM");
  const bool ok = cert != nullptr ? PEM_write_bio_X509(bio.get(), cert) == 1
                                  : PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0,
                                                             nullptr, nullptr) == 1;
  if (!ok) return OpensslError("PEM");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

Result<TlsFiles> MakeClusterTls(const std::string& cluster, const std::vector<std::string>& hosts,
                                int days) {
  if (hosts.empty()) return InvalidArgumentError("tls: no host names for the server");
  if (days <= 0) return InvalidArgumentError("tls: validity must be positive");
  std::string san;
  for (const std::string& h : hosts) {
    unsigned char buf[16];
    const bool ip =
        inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1;
    san += fmt::format("{}{}:{}", san.empty() ? "" : ",", ip ? "IP" : "DNS", h);
  }
  KC_ASSIGN_OR_RETURN(Key ca_key, NewKey());
  KC_ASSIGN_OR_RETURN(Cert ca,
                      NewCert(ca_key.get(), "Kuangchao CA " + cluster, nullptr, nullptr, days,
                              {{NID_basic_constraints, "critical,CA:TRUE"},
                               {NID_key_usage, "critical,keyCertSign,cRLSign"},
                               {NID_subject_key_identifier, "hash"}}));
  KC_ASSIGN_OR_RETURN(Key server_key, NewKey());
  KC_ASSIGN_OR_RETURN(Cert server,
                      NewCert(server_key.get(), "kcd " + cluster, ca.get(), ca_key.get(), days,
                              {{NID_basic_constraints, "critical,CA:FALSE"},
                               {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
                               {NID_ext_key_usage, "serverAuth"},
                               {NID_subject_alt_name, san},
                               {NID_authority_key_identifier, "keyid"}}));
  TlsFiles out;
  KC_ASSIGN_OR_RETURN(out.ca_cert_pem, Pem(ca.get(), nullptr));
  KC_ASSIGN_OR_RETURN(out.ca_key_pem, Pem(nullptr, ca_key.get()));
  KC_ASSIGN_OR_RETURN(out.server_cert_pem, Pem(server.get(), nullptr));
  KC_ASSIGN_OR_RETURN(out.server_key_pem, Pem(nullptr, server_key.get()));
  return out;
}

}  // namespace kc::api
