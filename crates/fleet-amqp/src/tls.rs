//! TLS to the broker (`amqps://`): the files `[broker]` names, read at every connect (so a
//! renewed certificate is taken up by the next one), and a failed handshake said plainly:
//! which check failed, and which key to look at.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError};

use crate::error::AmqpError;

/// The files of a TLS link. All unset: the broker's certificate is checked against the system's
/// CAs, and the gateway shows no certificate of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// `broker.ca_file`: the PEM certificate(s) of the CA that signs the broker's certificate,
    /// trusted besides the system's CAs.
    pub ca_file: Option<PathBuf>,
    /// `broker.cert_file`: this gateway's PEM certificate (its chain may follow), shown to a
    /// broker that asks for one (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// `broker.key_file`: the PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Checks what needs no file read: the files go with an `amqps://` URI (`scheme` is the
    /// URI's), and a certificate with its key.
    pub fn check(&self, scheme: &str) -> Result<(), AmqpError> {
        let named: Vec<&str> = [
            ("broker.ca_file", &self.ca_file),
            ("broker.cert_file", &self.cert_file),
            ("broker.key_file", &self.key_file),
        ]
        .into_iter()
        .filter_map(|(key, path)| path.as_ref().map(|_| key))
        .collect();
        if !named.is_empty() && scheme != "amqps" {
            return Err(AmqpError::BadTls(format!(
                "{} set, but broker.uri is {scheme}://, not amqps://: the link would not use TLS",
                named.join(", ")
            )));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(AmqpError::BadTls(
                "broker.cert_file is set without broker.key_file, its private key".into(),
            )),
            (None, Some(_)) => Err(AmqpError::BadTls(
                "broker.key_file is set without broker.cert_file, its certificate".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The TLS settings of a link to a URI of `scheme`, the files read and checked now.
    pub(crate) async fn config(&self, scheme: &str) -> Result<OwnedTLSConfig, AmqpError> {
        self.check(scheme)?;
        let cert_chain = match &self.ca_file {
            Some(path) => Some(certificates("broker.ca_file", path).await?),
            None => None,
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
                pem: certificates("broker.cert_file", cert).await?.into_bytes(),
                key: private_key(key).await?,
            }),
            _ => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }

    /// What a failed connect to `host` over TLS says. A failed handshake is a refusal (retrying
    /// will not help until the files or the broker change) naming the check that failed and
    /// the key to look at. A connection the broker reset or ended is retried, with a hint: in
    /// TLS 1.3 a broker refuses a client certificate (or its absence) only after the client's
    /// handshake is done, and the client's first AMQP bytes, arriving after the broker closed,
    /// can make it reset the connection, so the alert that said why is lost. `None`: nothing
    /// TLS can tell.
    pub(crate) fn failure(&self, err: &lapin::Error, host: &str) -> Option<AmqpError> {
        let Some(tls) = rustls_error(err) else {
            return self.reset(err);
        };
        let ca = match &self.ca_file {
            Some(path) => format!("the CA in broker.ca_file ({})", path.display()),
            None => "a CA of this machine's (set broker.ca_file to the CA that signs it)".into(),
        };
        let message = match tls {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                format!("the broker's certificate is not signed by {ca}")
            }
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) => format!(
                "the broker's certificate does not name host '{host}' (broker.uri's host); it names {}",
                names(presented)
            ),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
                format!("the broker's certificate does not name host '{host}' (broker.uri's host)")
            }
            rustls::Error::InvalidCertificate(other) => {
                format!("the broker's certificate is refused: {other:?}")
            }
            rustls::Error::AlertReceived(alert) => match &self.cert_file {
                None if matches!(
                    alert,
                    AlertDescription::CertificateRequired | AlertDescription::HandshakeFailure
                ) =>
                {
                    format!(
                        "the broker demands a client certificate ({alert:?}); set broker.cert_file and broker.key_file"
                    )
                }
                None => format!("the broker ended the handshake: {alert:?}"),
                Some(cert) => format!(
                    "the broker refused this gateway's certificate, broker.cert_file ({}): {alert:?}",
                    cert.display()
                ),
            },
            other => format!("the handshake with the broker failed: {other}"),
        };
        Some(AmqpError::Refused(format!("TLS: {message}")))
    }

    /// The hint for a connection reset or ended during a TLS connect (see
    /// [`TlsFiles::failure`]); `None` for any other failure.
    fn reset(&self, err: &lapin::Error) -> Option<AmqpError> {
        let lapin::ErrorKind::IOError(io) = err.kind() else {
            return None;
        };
        if !matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::UnexpectedEof
        ) {
            return None;
        }
        let check = match &self.cert_file {
            None => "set broker.cert_file and broker.key_file".to_string(),
            Some(cert) => format!("check that it trusts broker.cert_file ({})", cert.display()),
        };
        Some(AmqpError::Unavailable(format!(
            "cannot connect to the broker: {io} (TLS: a broker that demands client certificates may end the connection so when it refuses one; if it does, {check})"
        )))
    }
}

/// The names a certificate presents, as a person reads them: `broker.internal, 10.0.0.7`
/// (rustls gives `DnsName("broker.internal")`, `IpAddress(10.0.0.7)`).
fn names(presented: &[String]) -> String {
    if presented.is_empty() {
        return "no host".into();
    }
    presented
        .iter()
        .map(|name| {
            name.split_once('(')
                .and_then(|(_, inner)| inner.strip_suffix(')'))
                .unwrap_or(name)
                .trim_matches('"')
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rustls error under a lapin one, if there is one: the handshake's failure comes as an
/// I/O error that wraps it.
fn rustls_error(err: &lapin::Error) -> Option<&rustls::Error> {
    let lapin::ErrorKind::IOError(io) = err.kind() else {
        return None;
    };
    let mut next: Option<&(dyn StdError + 'static)> = Some(io.as_ref());
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // An I/O error's `source` skips the error it wraps: look at that one itself.
        next = match current.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => current.source(),
        };
    }
    None
}

/// Reads `path`, the file of key `key`.
async fn read(key: &str, path: &Path) -> Result<Vec<u8>, AmqpError> {
    tokio::fs::read(path)
        .await
        .map_err(|e| AmqpError::BadTls(format!("{key} {}: {e}", path.display())))
}

/// The PEM certificates in the file of key `key` at `path`, as PEM text: at least one, each
/// well formed.
async fn certificates(key: &str, path: &Path) -> Result<String, AmqpError> {
    let bytes = read(key, path).await?;
    let bad = |what: String| AmqpError::BadTls(format!("{key} {}: {what}", path.display()));
    let count = CertificateDer::pem_slice_iter(&bytes)
        .try_fold(0usize, |n, cert| cert.map(|_| n + 1))
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if count == 0 {
        return Err(bad("holds no PEM certificate".into()));
    }
    String::from_utf8(bytes).map_err(|_| bad("not PEM: not text".into()))
}

/// The PEM private key in `broker.key_file` at `path`.
async fn private_key(path: &Path) -> Result<Vec<u8>, AmqpError> {
    let bytes = read("broker.key_file", path).await?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        AmqpError::BadTls(format!(
            "broker.key_file {}: no PEM private key: {e}",
            path.display()
        ))
    })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>) -> TlsFiles {
        TlsFiles {
            ca_file: ca.map(Path::to_path_buf),
            cert_file: cert.map(Path::to_path_buf),
            key_file: key.map(Path::to_path_buf),
        }
    }

    fn refusal(err: &AmqpError) -> String {
        assert!(!err.retry(), "{err}");
        err.to_string()
    }

    #[test]
    fn the_files_need_amqps_and_a_certificate_its_key() {
        let p = Path::new("/etc/fleet/x.pem");
        assert!(TlsFiles::default().check("amqp").is_ok());
        assert!(files(Some(p), Some(p), Some(p)).check("amqps").is_ok());
        let plain = files(Some(p), Some(p), Some(p)).check("amqp").unwrap_err();
        assert_eq!(
            refusal(&plain),
            "broker.ca_file, broker.cert_file, broker.key_file set, but broker.uri is amqp://, not amqps://: the link would not use TLS"
        );
        let alone = files(None, Some(p), None).check("amqps").unwrap_err();
        assert!(refusal(&alone).contains("broker.cert_file is set without broker.key_file"));
        let alone = files(None, None, Some(p)).check("amqps").unwrap_err();
        assert!(refusal(&alone).contains("broker.key_file is set without broker.cert_file"));
    }

    #[tokio::test]
    async fn a_missing_or_non_pem_file_is_named_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = files(Some(&missing), None, None)
            .config("amqps")
            .await
            .unwrap_err();
        let text = refusal(&err);
        assert!(
            text.starts_with(&format!("broker.ca_file {}: ", missing.display())),
            "{text}"
        );

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let err = files(Some(&junk), None, None)
            .config("amqps")
            .await
            .unwrap_err();
        assert_eq!(
            refusal(&err),
            format!(
                "broker.ca_file {}: holds no PEM certificate",
                junk.display()
            )
        );

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = files(None, Some(&broken), Some(&junk))
            .config("amqps")
            .await
            .unwrap_err();
        let text = refusal(&err);
        assert!(
            text.starts_with(&format!("broker.cert_file {}: not PEM", broken.display())),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_key_file_without_a_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        // A certificate's PEM framing around bytes nobody checks here: only its form counts.
        let cert = dir.path().join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = files(None, Some(&cert), Some(&cert))
            .config("amqps")
            .await
            .unwrap_err();
        let text = refusal(&err);
        assert!(
            text.starts_with(&format!(
                "broker.key_file {}: no PEM private key",
                cert.display()
            )),
            "{text}"
        );
    }

    /// A lapin error as a failed handshake gives it: an I/O error around rustls's.
    fn handshake(err: rustls::Error) -> lapin::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, err).into()
    }

    #[test]
    fn a_failed_handshake_says_which_check_failed() {
        let ca = Path::new("/etc/fleet/ca.pem");
        let cert = Path::new("/etc/fleet/gw.pem");
        let with_ca = files(Some(ca), None, None);
        let said = |files: &TlsFiles, err: rustls::Error| {
            refusal(&files.failure(&handshake(err), "broker.internal").unwrap())
        };

        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert_eq!(
            said(&with_ca, unknown.clone()),
            "TLS: the broker's certificate is not signed by the CA in broker.ca_file (/etc/fleet/ca.pem)"
        );
        assert!(said(&TlsFiles::default(), unknown).contains("set broker.ca_file"));

        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert_eq!(
            said(&with_ca, name),
            "TLS: the broker's certificate does not name host 'broker.internal' (broker.uri's host)"
        );
        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("broker.internal")
                .unwrap()
                .to_owned(),
            presented: vec![
                "DnsName(\"other.internal\")".into(),
                "IpAddress(10.0.0.7)".into(),
            ],
        });
        assert_eq!(
            said(&with_ca, name),
            "TLS: the broker's certificate does not name host 'broker.internal' (broker.uri's host); it names other.internal, 10.0.0.7"
        );

        let required = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        assert_eq!(
            said(&with_ca, required),
            "TLS: the broker demands a client certificate (CertificateRequired); set broker.cert_file and broker.key_file"
        );
        let bad = rustls::Error::AlertReceived(AlertDescription::UnknownCA);
        assert_eq!(
            said(&files(Some(ca), Some(cert), Some(cert)), bad),
            "TLS: the broker refused this gateway's certificate, broker.cert_file (/etc/fleet/gw.pem): UnknownCA"
        );

        // Not a TLS failure: left to the caller.
        let refused: lapin::Error =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(with_ca.failure(&refused, "broker.internal").is_none());
    }

    #[test]
    fn a_reset_during_a_tls_connect_is_retried_with_a_hint_at_client_certificates() {
        let reset = || -> lapin::Error {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Connection reset by peer",
            )
            .into()
        };
        let bare = TlsFiles::default().failure(&reset(), "b").unwrap();
        assert!(bare.retry(), "{bare}");
        assert_eq!(
            bare.to_string(),
            "cannot connect to the broker: Connection reset by peer (TLS: a broker that demands client certificates may end the connection so when it refuses one; if it does, set broker.cert_file and broker.key_file)"
        );
        let cert = Path::new("/etc/fleet/gw.pem");
        let with_cert = files(None, Some(cert), Some(cert))
            .failure(&reset(), "b")
            .unwrap();
        assert!(
            with_cert.to_string().ends_with(
                "if it does, check that it trusts broker.cert_file (/etc/fleet/gw.pem))"
            ),
            "{with_cert}"
        );
    }
}
