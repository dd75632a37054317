//! Certificates for the test API server, generated fresh for every control plane: a CA, the
//! server's serving certificate for 127.0.0.1, an admin client certificate in system:masters,
//! the service-account signing key, the aggregation layer's front-proxy client certificate, and
//! KEDA's certificate (its metrics API server and its operator's gRPC service), the real node's
//! kubelet certificate; and, for a Prometheus that serves TLS, a CA of its own, its serving
//! certificate and a client certificate ([`TlsMaterial`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use crate::error::{Result, io};

/// Paths of the PEM files written by [`write`].
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
    /// The client certificate the API server proxies to aggregated APIs with (CN
    /// `front-proxy-client`); the request-header CA that vouches for it is `ca`.
    pub front_proxy_cert: PathBuf,
    pub front_proxy_key: PathBuf,
    /// KEDA's directory: `ca.crt`, and `tls.crt`/`tls.key` for 127.0.0.1 and the metrics API
    /// server's Service name, for serving and as a client (KEDA's gRPC is mutual TLS).
    pub keda_dir: PathBuf,
    /// The kubelet's client certificate: the node [`NODE_NAME`] (CN `system:node:<name>` in
    /// `system:nodes`), which the Node authorizer limits to its own Pods.
    pub kubelet_cert: PathBuf,
    pub kubelet_key: PathBuf,
}

/// The name of the real node ([`crate::TestNode`]) the kubelet registers.
pub const NODE_NAME: &str = "lanepool-node";

/// The first address of the Service range: the `kubernetes` Service, which in-cluster clients
/// reach the API server through.
pub const KUBERNETES_SERVICE_IP: [u8; 4] = [10, 0, 0, 1];

/// The Service the aggregation layer reaches KEDA's metrics API server through: its serving
/// certificate must name it.
pub const KEDA_METRICS_SERVICE: (&str, &str) = ("keda", "keda-metrics-apiserver");

/// A fresh CA: its certificate and what signs with it.
fn certificate_authority(name: &str) -> Result<(Certificate, Issuer<'static, KeyPair>)> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    Ok((ca_cert, Issuer::new(ca_params, ca_key)))
}

/// Generates the certificates and writes them into `dir`. The API server's serving certificate
/// names 127.0.0.1, the `kubernetes` Service's address and `host` (the address a real node's Pods
/// reach it at), when given.
pub fn write(dir: &Path, host: Option<IpAddr>) -> Result<CertFiles> {
    let (ca_cert, ca) = certificate_authority("lanepool-testenv-ca")?;

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    serving
        .subject_alt_names
        .push(SanType::IpAddress(KUBERNETES_SERVICE_IP.into()));
    if let Some(host) = host {
        serving.subject_alt_names.push(SanType::IpAddress(host));
    }
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name.push(DnType::CommonName, "admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &ca)?;

    let service_account_key = KeyPair::generate()?;

    let kubelet_key = KeyPair::generate()?;
    let mut kubelet = CertificateParams::new(Vec::<String>::new())?;
    kubelet
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{NODE_NAME}"));
    kubelet
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    kubelet.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let kubelet_cert = kubelet.signed_by(&kubelet_key, &ca)?;

    let front_proxy_key = KeyPair::generate()?;
    let mut front_proxy = CertificateParams::new(Vec::<String>::new())?;
    front_proxy
        .distinguished_name
        .push(DnType::CommonName, "front-proxy-client");
    front_proxy.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let front_proxy_cert = front_proxy.signed_by(&front_proxy_key, &ca)?;

    let (namespace, service) = KEDA_METRICS_SERVICE;
    let keda_key = KeyPair::generate()?;
    let mut keda = CertificateParams::new(vec![
        "localhost".to_string(),
        format!("{service}.{namespace}.svc"),
    ])?;
    keda.subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    keda.distinguished_name.push(DnType::CommonName, "keda");
    keda.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let keda_cert = keda.signed_by(&keda_key, &ca)?;
    let keda_dir = dir.join("keda-certs");
    std::fs::create_dir_all(&keda_dir).map_err(io(format!("creating {}", keda_dir.display())))?;

    let files = CertFiles {
        ca: dir.join("ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        service_account_key: dir.join("service-account.key"),
        service_account_public_key: dir.join("service-account.pub"),
        front_proxy_cert: dir.join("front-proxy-client.crt"),
        front_proxy_key: dir.join("front-proxy-client.key"),
        keda_dir: keda_dir.clone(),
        kubelet_cert: dir.join("kubelet.crt"),
        kubelet_key: dir.join("kubelet.key"),
    };
    for (path, pem) in [
        (&files.ca, ca_cert.pem()),
        (&files.serving_cert, serving_cert.pem()),
        (&files.serving_key, serving_key.serialize_pem()),
        (&files.admin_cert, admin_cert.pem()),
        (&files.admin_key, admin_key.serialize_pem()),
        (
            &files.service_account_key,
            service_account_key.serialize_pem(),
        ),
        (
            &files.service_account_public_key,
            service_account_key.public_key_pem(),
        ),
        (&files.front_proxy_cert, front_proxy_cert.pem()),
        (&files.front_proxy_key, front_proxy_key.serialize_pem()),
        (&files.kubelet_cert, kubelet_cert.pem()),
        (&files.kubelet_key, kubelet_key.serialize_pem()),
        (&keda_dir.join("ca.crt"), ca_cert.pem()),
        (&keda_dir.join("tls.crt"), keda_cert.pem()),
        (&keda_dir.join("tls.key"), keda_key.serialize_pem()),
    ] {
        std::fs::write(path, pem).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok(files)
}

/// A CA, a serving certificate for 127.0.0.1 and localhost, and a client certificate, both
/// signed by that CA: PEM for files and Secrets, DER for a client in this process.
pub struct TlsMaterial {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    pub ca_der: CertificateDer<'static>,
    pub client_cert_der: CertificateDer<'static>,
    pub client_key_der: PrivatePkcs8KeyDer<'static>,
}

/// Generates a [`TlsMaterial`] under a CA of its own.
pub fn tls_material(name: &str) -> Result<TlsMaterial> {
    let (ca_cert, ca) = certificate_authority(&format!("{name}-ca"))?;

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    serving.distinguished_name.push(DnType::CommonName, name);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client
        .distinguished_name
        .push(DnType::CommonName, "lanepool-operator");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &ca)?;

    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
        ca_der: ca_cert.der().clone(),
        client_cert_der: client_cert.der().clone(),
        client_key_der: PrivatePkcs8KeyDer::from(client_key.serialize_der()),
    })
}
