// TLS material for a cluster: `kc init` makes a certificate authority and a server
// certificate for kcd (ECDSA P-256, SHA-256), so every connection to kcd is TLS and clients
// trust the cluster's own CA. Docs: docs/operations/cluster.md.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace kc::api {

struct TlsFiles {
  std::string ca_cert_pem;      // the cluster's CA: clients trust this
  std::string ca_key_pem;       // kept by the system admin to issue more certificates
  std::string server_cert_pem;  // kcd's certificate, signed by the CA
  std::string server_key_pem;
};

// A new CA named "Kuangchao CA <cluster>" and a server certificate for `hosts` (DNS names or
// IP addresses, written as subjectAltName entries), both valid for `days`. kInternal if
// OpenSSL fails; kInvalidArgument for no hosts or a non-positive validity.
Result<TlsFiles> MakeClusterTls(const std::string& cluster, const std::vector<std::string>& hosts,
                                int days);

}  // namespace kc::api
