//! The `tls` section (certificates of the chain's listeners) and `mqtt.listen_tls`.
//!
//! ```yaml
//! tls: { cert: certs/server.pem, key: certs/server.key }
//! # or several, chosen by the client's SNI (the first when it names none of them):
//! tls:
//!   - { cert: certs/api.pem, key: certs/api.key }
//!   - { cert: certs/devices.pem, key: certs/devices.key }
//! mqtt: { listen: 127.0.0.1:1883, listen_tls: 0.0.0.0:8883 }
//! ```
//!
//! Only the shape is checked here (paths resolved against the spec's folder); the agent
//! reads the files when the chain comes up, and its errors point back at these lines
//! ([`CertSpec::cert_line`], [`CertSpec::key_line`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use saphyr::{MarkedYaml, YamlData};

use crate::functions::absolute;
use crate::yaml::{get, kind, line, scalar_text, Cx, Map};
use crate::*;

/// `mqtt.listen_tls` and its line, and the `mqtt` section without it (`None`, `None` when the
/// spec has no `listen_tls`).
pub(crate) type MqttTls<'y> = (Option<(SocketAddr, usize)>, Option<MarkedYaml<'y>>);

impl Cx {
    /// The top-level `tls` section: one `{ cert, key }` or a list of them.
    pub(crate) fn tls(&self, top: &Map<'_, '_>, dir: &Path) -> Result<Option<TlsSpec>, SpecError> {
        let Some(n) = get(top, "tls") else {
            return Ok(None);
        };
        let certificates = match &n.data {
            YamlData::Mapping(_) => vec![self.cert(n, "tls", dir)?],
            YamlData::Sequence(list) => {
                if list.is_empty() {
                    return Err(self.err(
                        line(n),
                        "tls",
                        "an empty list; give at least one `{ cert: FILE, key: FILE }`",
                    ));
                }
                list.iter()
                    .enumerate()
                    .map(|(i, c)| self.cert(c, &format!("tls[{i}]"), dir))
                    .collect::<Result<_, _>>()?
            }
            _ => {
                return Err(self.err(
                    line(n),
                    "tls",
                    format!(
                        "expected `{{ cert: FILE, key: FILE }}` or a list of them, found {}",
                        kind(n)
                    ),
                ))
            }
        };
        Ok(Some(TlsSpec {
            line: line(n),
            certificates,
        }))
    }

    fn cert(&self, n: &MarkedYaml<'_>, field: &str, dir: &Path) -> Result<CertSpec, SpecError> {
        let map = self.mapping(n, field)?;
        let prefix = format!("{field}.");
        self.only_known(&map, &prefix, &["cert", "key"])?;
        let file = |name: &str| -> Result<(PathBuf, usize), SpecError> {
            let v = self.required(n, &map, name, &prefix)?;
            let path = self.string(v, &format!("{prefix}{name}"))?;
            if path.is_empty() {
                return Err(self.err(
                    line(v),
                    &format!("{prefix}{name}"),
                    "an empty path; give the PEM file's path (relative to the spec's folder)",
                ));
            }
            Ok((PathBuf::from(absolute(&dir.join(path))), line(v)))
        };
        let (cert, cert_line) = file("cert")?;
        let (key, key_line) = file("key")?;
        Ok(CertSpec {
            field: field.to_owned(),
            cert,
            cert_line,
            key,
            key_line,
        })
    }

    /// `mqtt.listen_tls`, taken out of the `mqtt` section (which is read without it): the
    /// address, and the `mqtt` node as the rest of the reader expects it.
    pub(crate) fn mqtt_tls<'y>(&self, top: &Map<'_, 'y>) -> Result<MqttTls<'y>, SpecError> {
        let Some(n) = get(top, "mqtt") else {
            return Ok((None, None));
        };
        let map = self.mapping(n, "mqtt")?;
        let Some(l) = get(&map, "listen_tls") else {
            return Ok((None, None));
        };
        let addr = self.address(l, "mqtt.listen_tls")?;
        if get(&map, "listen").is_none() && get(&map, "broker").is_none() {
            return Err(self.err(
                line(l),
                "mqtt.listen_tls",
                "needs `listen` too; put the clear-text listener on loopback (`listen: \
                 127.0.0.1:1883`) if devices only come over TLS",
            ));
        }
        let mut rest = n.clone();
        if let YamlData::Mapping(m) = &mut rest.data {
            m.retain(|k, _| scalar_text(k).as_deref() != Some("listen_tls"));
        }
        Ok((Some((addr, line(l))), Some(rest)))
    }

    /// Checks `mqtt.listen_tls` (at `line`) against the rest of the spec.
    pub(crate) fn check_mqtt_tls(
        &self,
        line: usize,
        mqtt: Option<&MqttSpec>,
        tls: Option<&TlsSpec>,
    ) -> Result<(), SpecError> {
        if !matches!(mqtt, Some(MqttSpec::Listen(_))) {
            return Err(self.err(
                line,
                "mqtt.listen_tls",
                "only with `listen` (devices connect to the gateway); put the clear-text \
                 listener on loopback (`listen: 127.0.0.1:1883`) if devices only come over TLS",
            ));
        }
        if tls.is_none() {
            return Err(self.err(
                line,
                "mqtt.listen_tls",
                "the chain has no certificate; add `tls: { cert: FILE, key: FILE }`",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::*;

    const CHAIN: &str = "\
name: secure
functions:
  upper: { command: [/bin/upper] }
routes:
  - http: POST /hello
    mqtt: sensors/+
    sequence: [upper]
";

    fn parsed(extra: &str) -> Result<ChainSpec, String> {
        parse(Path::new("/srv/c.yaml"), &format!("{CHAIN}{extra}")).map_err(|e| e.to_string())
    }

    #[test]
    fn one_certificate_or_several_resolved_against_the_spec_folder() {
        let one = parsed(
            "mqtt: { listen: 127.0.0.1:1883 }\ntls: { cert: certs/a.pem, key: /keys/a.key }\n",
        )
        .unwrap();
        let tls = one.tls.expect("a tls section");
        assert_eq!(tls.line, 9);
        assert_eq!(tls.certificates.len(), 1);
        let c = &tls.certificates[0];
        assert_eq!(c.field, "tls");
        assert_eq!(c.cert, Path::new("/srv/certs/a.pem"));
        assert_eq!(c.key, Path::new("/keys/a.key"));
        assert_eq!((c.cert_line, c.key_line), (9, 9));
        assert_eq!(one.mqtt_tls, None);

        let several = parsed(
            "mqtt: { listen: 127.0.0.1:1883 }\ntls:\n  - { cert: a.pem, key: a.key }\n  - cert: b.pem\n    key: b.key\n",
        )
        .unwrap()
        .tls
        .unwrap();
        let fields: Vec<_> = several
            .certificates
            .iter()
            .map(|c| c.field.as_str())
            .collect();
        assert_eq!(fields, ["tls[0]", "tls[1]"]);
        assert_eq!(several.certificates[1].key, Path::new("/srv/b.key"));
        assert_eq!(several.certificates[1].key_line, 12);

        let clear = parsed("mqtt: { listen: 127.0.0.1:1883 }\n").unwrap();
        assert_eq!((clear.tls, clear.mqtt_tls), (None, None));
    }

    #[test]
    fn mqtt_listens_over_tls_beside_clear_text() {
        let s = parsed(
            "mqtt: { listen: 127.0.0.1:1883, listen_tls: 127.0.0.1:8883 }\ntls: { cert: a.pem, key: a.key }\n",
        )
        .unwrap();
        assert_eq!(
            s.mqtt,
            Some(MqttSpec::Listen("127.0.0.1:1883".parse().unwrap()))
        );
        assert_eq!(s.mqtt_tls, Some("127.0.0.1:8883".parse().unwrap()));
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let cases = [
            (
                "mqtt: { listen: 127.0.0.1:1883 }\ntls: { cert: a.pem }\n",
                "/srv/c.yaml:9: tls.key: ",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883 }\ntls: { cert: a.pem, key: a.key, ca: x }\n",
                "/srv/c.yaml:9: tls.ca: ",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883 }\ntls: []\n",
                "/srv/c.yaml:9: tls: an empty list",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883 }\ntls: cert.pem\n",
                "/srv/c.yaml:9: tls: expected `{ cert: FILE, key: FILE }` or a list",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883 }\ntls:\n  - { cert: a.pem, key: a.key }\n  - { cert: \"\", key: b.key }\n",
                "/srv/c.yaml:11: tls[1].cert: an empty path",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883, listen_tls: 127.0.0.1:8883 }\n",
                "/srv/c.yaml:8: mqtt.listen_tls: the chain has no certificate",
            ),
            (
                "mqtt: { listen_tls: 127.0.0.1:8883 }\ntls: { cert: a.pem, key: a.key }\n",
                "/srv/c.yaml:8: mqtt.listen_tls: needs `listen` too",
            ),
            (
                "mqtt: { broker: \"h:1883\", listen_tls: 127.0.0.1:8883 }\ntls: { cert: a.pem, key: a.key }\n",
                "/srv/c.yaml:8: mqtt.listen_tls: only with `listen`",
            ),
            (
                "mqtt: { listen: 127.0.0.1:1883, listen_tls: nowhere }\ntls: { cert: a.pem, key: a.key }\n",
                "/srv/c.yaml:8: mqtt.listen_tls: `nowhere` is not IP:PORT",
            ),
        ];
        for (extra, want) in cases {
            let got = parsed(extra).unwrap_err();
            assert!(got.starts_with(want), "{extra}\n got: {got}\nwant: {want}");
        }
    }
}
