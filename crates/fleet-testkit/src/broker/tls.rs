//! A private node's TLS listener: the CA, certificates and keys the harness makes for it, and
//! the lines of its config that turn the listener on.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// What a private node's TLS listener is made with (see [`super::PrivateNode::start_tls`]).
#[derive(Clone, Debug)]
pub struct TlsSetup {
    /// The names the node's certificate is issued for: DNS names or IP addresses.
    pub server_names: Vec<String>,
    /// Whether the node demands a client certificate the CA signed (mutual TLS).
    pub client_certs: bool,
}

impl Default for TlsSetup {
    /// A certificate for `localhost` and `127.0.0.1`, and no client certificate asked for.
    fn default() -> Self {
        Self {
            server_names: vec!["localhost".into(), "127.0.0.1".into()],
            client_certs: false,
        }
    }
}

/// The PEM files the harness made for a node's TLS listener, in `tls/` of the node's
/// directory: what a client needs, right and wrong.
#[derive(Clone, Debug)]
pub struct TlsCerts {
    /// The CA that signed the node's certificate and [`TlsCerts::client_cert_file`].
    pub ca_file: PathBuf,
    /// A CA that signed nothing the node shows or trusts: a client trusting it alone is
    /// refused.
    pub other_ca_file: PathBuf,
    /// A client certificate the CA signed (common name `fleetd-test-client`).
    pub client_cert_file: PathBuf,
    /// The private key of [`TlsCerts::client_cert_file`].
    pub client_key_file: PathBuf,
    /// A client certificate of the same name the other CA signed: a node that demands client
    /// certificates refuses it.
    pub other_client_cert_file: PathBuf,
    /// The private key of [`TlsCerts::other_client_cert_file`].
    pub other_client_key_file: PathBuf,
    /// The node's certificate.
    pub(super) server_cert_file: PathBuf,
    /// The node's private key.
    pub(super) server_key_file: PathBuf,
}

/// The common name of the client certificate.
pub const CLIENT_NAME: &str = "fleetd-test-client";

impl TlsCerts {
    /// Makes a CA, the node's certificate for `setup`'s names, a client certificate, and an
    /// unrelated CA with a client certificate of its own, written under `dir` (keys readable
    /// by the user only).
    pub(super) fn make(dir: &Path, setup: &TlsSetup) -> anyhow::Result<TlsCerts> {
        std::fs::create_dir(dir)?;
        let ca = new_ca("fleet test CA")?;
        let other = new_ca("fleet test other CA")?;
        let (server_cert, server_key) = leaf(
            &ca,
            setup.server_names.first().map_or("server", String::as_str),
            setup.server_names.clone(),
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) = leaf(
            &ca,
            CLIENT_NAME,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let (other_client_cert, other_client_key) = leaf(
            &other,
            CLIENT_NAME,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let certs = TlsCerts {
            ca_file: dir.join("ca.pem"),
            other_ca_file: dir.join("other-ca.pem"),
            client_cert_file: dir.join("client.pem"),
            client_key_file: dir.join("client.key"),
            other_client_cert_file: dir.join("other-client.pem"),
            other_client_key_file: dir.join("other-client.key"),
            server_cert_file: dir.join("server.pem"),
            server_key_file: dir.join("server.key"),
        };
        std::fs::write(&certs.ca_file, ca.pem())?;
        std::fs::write(&certs.other_ca_file, other.pem())?;
        std::fs::write(&certs.client_cert_file, client_cert)?;
        std::fs::write(&certs.server_cert_file, server_cert)?;
        std::fs::write(&certs.other_client_cert_file, other_client_cert)?;
        private(&certs.client_key_file, &client_key)?;
        private(&certs.other_client_key_file, &other_client_key)?;
        private(&certs.server_key_file, &server_key)?;
        Ok(certs)
    }

    /// The `rabbit` settings of a TLS listener on 127.0.0.1:`port` with these files, in the
    /// classic Erlang config format.
    pub(super) fn rabbit_settings(&self, port: u16, setup: &TlsSetup) -> String {
        let verify = if setup.client_certs {
            "verify_peer"
        } else {
            "verify_none"
        };
        format!(
            "{{ssl_listeners, [{{\"127.0.0.1\", {port}}}]}},\n {{ssl_options, [{{cacertfile, {}}}, {{certfile, {}}}, {{keyfile, {}}}, {{verify, {verify}}}, {{fail_if_no_peer_cert, {}}}]}}",
            erlang_string(&self.ca_file),
            erlang_string(&self.server_cert_file),
            erlang_string(&self.server_key_file),
            setup.client_certs
        )
    }
}

/// A new self-signed CA that may sign certificates.
fn new_ca(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// A certificate `ca` signed for `purpose`, named `common_name` with the alternative names
/// `names`: its PEM and its private key's.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    names: Vec<String>,
    purpose: ExtendedKeyUsagePurpose,
) -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![purpose];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `text` to a new file at `path` readable by the user only.
fn private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

/// `path` as an Erlang string literal.
fn erlang_string(path: &Path) -> String {
    let escaped = path
        .to_string_lossy()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    format!("\"{escaped}\"")
}
