//! A route's `async`, `retry` and `idempotent`: how the gateway delivers a request that
//! may wait (answered `202 Accepted` at once, run later from a durable queue) or that may be
//! run again when the chain answered with a passing error.

use std::time::Duration;

#[cfg(feature = "reader")]
use saphyr::MarkedYaml;

#[cfg(feature = "reader")]
use crate::yaml::{get, line, Cx};
#[cfg(feature = "reader")]
use crate::SpecError;

/// Attempts when `retry` sets none.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// First backoff when `retry` sets none.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(100);
/// Longest backoff when `retry` sets none.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Statuses retried when `retry` names none: the ones that say "try again later".
pub const DEFAULT_RETRY_ON: [u16; 3] = [502, 503, 504];

/// How a route's requests are delivered; the default runs each once, synchronously.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliverySpec {
    /// `async: true`: every request is queued and answered `202 Accepted` (as if it sent
    /// `Prefer: respond-async`).
    pub is_async: bool,
    /// `retry`: how a failed run is run again (async requests always; synchronous ones only
    /// when `idempotent`). `None`: one attempt.
    pub retry: Option<RetrySpec>,
    /// `idempotent: true`: a synchronous request may be retried too.
    pub idempotent: bool,
}

/// `retry: { attempts, backoff, max_backoff, statuses }`: exponential backoff with full jitter,
/// never past the request's deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrySpec {
    /// Runs in all, the first included (1 to 100).
    pub attempts: u32,
    /// The backoff before the second run; it doubles each time (the wait is drawn at random
    /// below it: full jitter).
    pub backoff: Duration,
    /// The backoff stops doubling here.
    pub max_backoff: Duration,
    /// The statuses that are retried; any other failure goes to the dead-letter queue at once.
    pub statuses: Vec<u16>,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            attempts: DEFAULT_ATTEMPTS,
            backoff: DEFAULT_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            statuses: DEFAULT_RETRY_ON.to_vec(),
        }
    }
}

#[cfg(feature = "reader")]
impl Cx {
    /// `routes[i].async`, `.retry`, `.idempotent` of mapping `m` (route entry `r`); `http`:
    /// the route has an HTTP trigger, `grpc`: it is a gRPC route.
    pub(crate) fn delivery(
        &self,
        m: &crate::yaml::Map<'_, '_>,
        r: &MarkedYaml<'_>,
        p: &str,
        http: bool,
        grpc: bool,
    ) -> Result<DeliverySpec, SpecError> {
        let mut d = DeliverySpec::default();
        if let Some(n) = get(m, "async") {
            d.is_async = self.boolean(n, &format!("{p}async"))?;
            if d.is_async && grpc {
                return Err(self.err(
                    line(n),
                    &format!("{p}async"),
                    "a gRPC call waits for its answer; only plain HTTP routes may be async",
                ));
            }
        }
        if let Some(n) = get(m, "retry") {
            d.retry = Some(self.retry(n, p)?);
        }
        if let Some(n) = get(m, "idempotent") {
            d.idempotent = self.boolean(n, &format!("{p}idempotent"))?;
            if d.idempotent && d.retry.is_none() {
                return Err(self.err(
                    line(n),
                    &format!("{p}idempotent"),
                    "only says a synchronous request may be retried; add `retry: {}` (or \
                     remove it)",
                ));
            }
        }
        if !http {
            for (field, set) in [
                ("async", d.is_async),
                ("retry", d.retry.is_some()),
                ("idempotent", d.idempotent),
            ] {
                if set {
                    return Err(self.err(
                        line(r),
                        &format!("{p}{field}"),
                        "only HTTP routes take it (MQTT and CoAP deliver at most once: see \
                         docs/spec.md); this route has no `http`",
                    ));
                }
            }
        }
        Ok(d)
    }

    fn retry(&self, n: &MarkedYaml<'_>, p: &str) -> Result<RetrySpec, SpecError> {
        let at = format!("{p}retry");
        let m = self.mapping(n, &at)?;
        self.only_known(
            &m,
            &format!("{at}."),
            &["attempts", "backoff", "max_backoff", "statuses"],
        )?;
        let mut r = RetrySpec::default();
        if let Some(n) = get(&m, "attempts") {
            r.attempts = self.integer(n, &format!("{at}.attempts"), 1, 100)? as u32;
        }
        let span = |n: &MarkedYaml<'_>, field: &str| -> Result<Duration, SpecError> {
            let d = self.duration(n, field)?;
            if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
                return Err(self.err(line(n), field, "must be 1ms to 1h"));
            }
            Ok(d)
        };
        if let Some(n) = get(&m, "backoff") {
            r.backoff = span(n, &format!("{at}.backoff"))?;
        }
        if let Some(n) = get(&m, "max_backoff") {
            r.max_backoff = span(n, &format!("{at}.max_backoff"))?;
            if r.max_backoff < r.backoff {
                return Err(self.err(
                    line(n),
                    &format!("{at}.max_backoff"),
                    format!("is shorter than backoff ({:?})", r.backoff),
                ));
            }
        } else {
            r.max_backoff = r.max_backoff.max(r.backoff);
        }
        if let Some(n) = get(&m, "statuses") {
            let field = format!("{at}.statuses");
            let list = self.sequence(n, &field)?;
            if list.is_empty() {
                return Err(self.err(
                    line(n),
                    &field,
                    "empty; name the statuses to retry (502, 503, 504 unless set)",
                ));
            }
            r.statuses = list
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    self.integer(e, &format!("{field}[{i}]"), 400, 599)
                        .map(|s| s as u16)
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(r)
    }
}

#[cfg(all(test, feature = "reader"))]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    const CHAIN: &str = "\
name: c
functions:
  f: { command: [/bin/f] }
routes:
";

    fn route(extra: &str) -> Result<DeliverySpec, String> {
        let text = format!("{CHAIN}  - http: POST /x\n{extra}    sequence: [f]\n");
        crate::parse(Path::new("c.yaml"), &text)
            .map(|s| s.routes[0].delivery.clone())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_run_once_synchronously() {
        assert_eq!(route("").unwrap(), DeliverySpec::default());
        let d = route("    async: true\n    retry: {}\n").unwrap();
        assert!(d.is_async && !d.idempotent);
        assert_eq!(d.retry, Some(RetrySpec::default()));
        assert_eq!(RetrySpec::default().statuses, vec![502, 503, 504]);
    }

    #[test]
    fn every_field_is_read() {
        let d = route(
            "    retry: { attempts: 5, backoff: 20ms, max_backoff: 1s, statuses: [500, 503] }\n    \
             idempotent: true\n",
        )
        .unwrap();
        assert_eq!(
            d,
            DeliverySpec {
                is_async: false,
                idempotent: true,
                retry: Some(RetrySpec {
                    attempts: 5,
                    backoff: Duration::from_millis(20),
                    max_backoff: Duration::from_secs(1),
                    statuses: vec![500, 503],
                }),
            }
        );
        // A backoff above the default ceiling raises the ceiling with it.
        let d = route("    retry: { backoff: 30s }\n").unwrap();
        assert_eq!(d.retry.unwrap().max_backoff, Duration::from_secs(30));
    }

    #[test]
    fn errors_name_line_and_field() {
        for (extra, want) in [
            (
                "    async: yes\n",
                "c.yaml:6: routes[0].async: expected true or false",
            ),
            (
                "    retry: { attempts: 0 }\n",
                "c.yaml:6: routes[0].retry.attempts: 0 is out of range",
            ),
            (
                "    retry: { tries: 2 }\n",
                "c.yaml:6: routes[0].retry.tries",
            ),
            (
                "    retry: { backoff: soon }\n",
                "c.yaml:6: routes[0].retry.backoff: `soon` is not a duration",
            ),
            (
                "    retry: { backoff: 2s, max_backoff: 1s }\n",
                "c.yaml:6: routes[0].retry.max_backoff: is shorter than backoff",
            ),
            (
                "    retry: { statuses: [] }\n",
                "c.yaml:6: routes[0].retry.statuses: empty",
            ),
            (
                "    retry: { statuses: [200] }\n",
                "c.yaml:6: routes[0].retry.statuses[0]: 200 is out of range",
            ),
            (
                "    idempotent: true\n",
                "c.yaml:6: routes[0].idempotent: only says",
            ),
        ] {
            let got = route(extra).unwrap_err();
            assert!(got.starts_with(want), "{extra:?}: {got}");
        }
        let mqtt = format!("{CHAIN}  - mqtt: a/b\n    async: true\n    sequence: [f]\n");
        let got = crate::parse(Path::new("c.yaml"), &mqtt)
            .unwrap_err()
            .to_string();
        assert!(
            got.starts_with("c.yaml:5: routes[0].async: only HTTP routes"),
            "{got}"
        );
        let grpc = format!("{CHAIN}  - grpc: a.S/M\n    async: true\n    sequence: [f]\n");
        let got = crate::parse(Path::new("c.yaml"), &grpc)
            .unwrap_err()
            .to_string();
        assert!(
            got.starts_with("c.yaml:6: routes[0].async: a gRPC call"),
            "{got}"
        );
    }
}
