//! What the serving tests share.

use tokio_rustls::rustls;

/// A TLS acceptor with a fresh self-signed certificate for 127.0.0.1: a real server cannot be
/// given an untrusted certificate on demand.
pub fn self_signed_acceptor() -> tokio_rustls::TlsAcceptor {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
}
