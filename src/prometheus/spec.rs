//! A pool's Prometheus connection from its spec, as both the operator and `lanepool replay` build
//! it: the URL checked first (allowed by `--allowed-prometheus-urls`; `https://` when it carries a
//! CA or credentials; credentials only to a URL the one who runs lanepool named), then the
//! timeout, the headers, and the credentials read from the pool's Secrets. Nothing is read and
//! no connection made for a URL refused.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};

use super::{AllowedUrls, BasicAuth, ClientCertificate, Connection};
use crate::api::PrometheusSource;
use crate::{Error, Result};

/// Which URLs a pool may name, and which one the operator (or replay) was given.
#[derive(Clone, Copy, Debug)]
pub struct Named<'a> {
    /// `--allowed-prometheus-urls`.
    pub allowed: &'a AllowedUrls,
    /// `--prometheus-url`: without a list, the only URL credentials go to.
    pub own: Option<&'a str>,
}

/// Whether a connection from `source` reads Secrets: a bearer token, basic auth, a CA or a
/// client certificate.
pub fn reads_secrets(source: &PrometheusSource) -> bool {
    sends_credentials(source) || source.ca_secret.is_some()
}

/// Whether a connection from `source` sends credentials: a bearer token, basic auth or a client
/// certificate (a CA only checks the server).
fn sends_credentials(source: &PrometheusSource) -> bool {
    source.bearer_token_secret.is_some()
        || source.basic_auth.is_some()
        || source.client_certificate_secret.is_some()
}

/// The connection to `url` that `source` describes. `read` gets a Secret of the pool's
/// namespace by name (`None`: there is none); `timeout` applies when the spec sets none.
pub async fn connection<R, F>(
    source: &PrometheusSource,
    url: String,
    named: Named<'_>,
    timeout: Duration,
    read: R,
) -> Result<Connection>
where
    R: Fn(String) -> F,
    F: Future<Output = Result<Option<Secret>>>,
{
    if !named.allowed.allows(&url) {
        return Err(Error::PrometheusUrlNotAllowed {
            url,
            allowed: named.allowed.describe(),
        });
    }
    if sends_credentials(source) && !named.allowed.names_for_credentials(&url, named.own) {
        return Err(Error::CredentialsNotAllowed { url });
    }
    // The CRD checks this for a URL in the spec; a --prometheus-url is checked here.
    if reads_secrets(source) && !url.starts_with("https://") {
        return Err(Error::invalid(
            "spec.prometheus.url",
            format!(
                "{url:?} must be https:// when a bearer token, basic auth, CA or client certificate is set"
            ),
        ));
    }
    let timeout = match &source.timeout {
        Some(t) => t.get().map_err(|e| Error::Duration {
            field: "spec.prometheus.timeout".into(),
            source: e,
        })?,
        None => timeout,
    };
    let secrets = Secrets(read);
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    let bearer_token = match &source.bearer_token_secret {
        Some(selector) => {
            let [token] = secrets
                .key("spec.prometheus.bearerTokenSecret", selector)
                .await?;
            Some(text(token))
        }
        None => None,
    };
    let basic_auth = match &source.basic_auth {
        Some(basic) => {
            let field = "spec.prometheus.basicAuth.usernameSecret";
            let [username] = secrets.key(field, &basic.username_secret).await?;
            let field = "spec.prometheus.basicAuth.passwordSecret";
            let [password] = secrets.key(field, &basic.password_secret).await?;
            Some(BasicAuth {
                username: text(username),
                password: text(password),
            })
        }
        None => None,
    };
    let ca_pem = match &source.ca_secret {
        Some(selector) => Some(secrets.key("spec.prometheus.caSecret", selector).await?[0].clone()),
        None => None,
    };
    let client_certificate = match &source.client_certificate_secret {
        Some(secret) => {
            let field = "spec.prometheus.clientCertificateSecret";
            let [certificate_pem, key_pem] = secrets
                .keys(field, &secret.name, ["tls.crt", "tls.key"])
                .await?;
            Some(ClientCertificate {
                certificate_pem,
                key_pem,
            })
        }
        None => None,
    };
    Ok(Connection {
        url,
        timeout,
        bearer_token,
        basic_auth,
        ca_pem,
        client_certificate,
        headers: source.headers.clone(),
    })
}

/// The pool's Secrets, each read when asked (and again at every connection, so a rotated Secret
/// is used from the next); `MissingSecret`, naming the field, when a Secret or a key is missing.
struct Secrets<R>(R);

impl<R, F> Secrets<R>
where
    R: Fn(String) -> F,
    F: Future<Output = Result<Option<Secret>>>,
{
    async fn key(&self, field: &'static str, selector: &SecretKeySelector) -> Result<[Vec<u8>; 1]> {
        self.keys(field, &selector.name, [&selector.key]).await
    }

    async fn keys<const N: usize>(
        &self,
        field: &'static str,
        name: &str,
        keys: [&str; N],
    ) -> Result<[Vec<u8>; N]> {
        let missing = || Error::MissingSecret {
            field,
            name: name.to_string(),
            keys: keys.map(|k| format!("{k:?}")).join(", "),
        };
        let secret = (self.0)(name.to_string()).await?.ok_or_else(missing)?;
        let mut data = secret.data.unwrap_or_default();
        let mut values = [(); N].map(|_| Vec::new());
        for (value, key) in values.iter_mut().zip(keys) {
            *value = data.remove(key).ok_or_else(missing)?.0;
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(keys: &[&str]) -> Secret {
        let data = keys
            .iter()
            .map(|k| (k.to_string(), k8s_openapi::ByteString(b"pem".to_vec())))
            .collect();
        Secret {
            data: Some(data),
            ..Secret::default()
        }
    }

    async fn read(found: Option<Secret>) -> String {
        let secrets = Secrets(|_| {
            let found = found.clone();
            async move { Ok(found) }
        });
        let field = "spec.prometheus.clientCertificateSecret";
        let read = secrets.keys(field, "team-b-tls", ["tls.crt", "tls.key"]);
        read.await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn a_missing_secret_and_a_missing_key_read_alike() {
        let absent = read(None).await;
        assert_eq!(
            absent,
            "spec.prometheus.clientCertificateSecret: Secret \"team-b-tls\" does not exist or \
             lacks one of the keys \"tls.crt\", \"tls.key\""
        );
        assert_eq!(read(Some(secret(&["tls.crt"]))).await, absent);
        assert_eq!(read(Some(secret(&[]))).await, absent);
    }
}
