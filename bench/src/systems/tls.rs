//! TLS for the systems: a self-signed certificate made per run, `nginx-tls` (nginx
//! terminating TLS in front of the monolith, what a team puts in front of a service today),
//! and the curl probe that checks an answer over a given protocol.
//!
//! nginx listens with `ssl http2` (ALPN offers `h2` and `http/1.1`), one worker, TLS 1.2 and
//! 1.3 as zerohop's gateway, and proxies to the monolith over clear HTTP/1.1 with keep-alive
//! upstream connections, so that the rows compare what terminating TLS costs each.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

use super::{effective_uid, free_port, nginx_binary, RunningSystem, StartOpts, SystemId};
use crate::h2load::Protocol;
use crate::{Component, Step};

/// A certificate and its key, PEM files, for `localhost` and `127.0.0.1`.
#[derive(Clone, Debug)]
pub struct Certificate {
    /// The self-signed certificate (also what clients trust).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl Certificate {
    /// Makes a self-signed ECDSA P-256 certificate valid for two days in `dir` with the
    /// openssl command.
    pub fn generate(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let c = Certificate {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&c.key)
            .arg("-out")
            .arg(&c.cert)
            .output()
            .context("starting openssl (Debian: `apt-get install -y openssl`)")?;
        if !out.status.success() {
            bail!(
                "openssl req failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(c)
    }

    /// The zerohop spec's `tls` line for this pair.
    pub fn spec_line(&self) -> Result<String> {
        let path = |p: &Path| {
            p.to_str()
                .map(|s| serde_json::to_string(s).expect("a str is JSON"))
                .ok_or_else(|| anyhow!("{} is not UTF-8", p.display()))
        };
        Ok(format!(
            "tls: {{ cert: {}, key: {} }}\n",
            path(&self.cert)?,
            path(&self.key)?
        ))
    }
}

/// POSTs `body` to `url` with curl over `protocol` (trusting `ca` for `https://`): status
/// and body, or why not (a protocol other than the one asked for is an error).
pub fn probe(
    url: &str,
    ca: Option<&Path>,
    protocol: Protocol,
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "2", "--data-binary", "@-"])
        // Body on stdout, status and protocol on stderr, after curl's own errors.
        .args(["-w", "%{stderr}\n%{http_code} %{http_version}"])
        .arg(match protocol {
            Protocol::Http1 | Protocol::Https => "--http1.1",
            Protocol::H2c => "--http2-prior-knowledge",
            Protocol::H2 => "--http2",
        });
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = run_with_stdin(cmd.arg(url), body)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    if !out.status.success() {
        return Err(format!("curl {url}: {}", stderr.trim()));
    }
    let (code, version) = last
        .split_once(' ')
        .ok_or_else(|| format!("curl printed {last:?}"))?;
    let want = if protocol.http2() { "2" } else { "1.1" };
    if version != want {
        return Err(format!(
            "curl spoke HTTP/{version} to {url}, expected HTTP/{want}"
        ));
    }
    let code = code.parse().map_err(|_| format!("curl printed {last:?}"))?;
    Ok((code, out.stdout))
}

fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> Result<std::process::Output, String> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting curl: {e}"))?;
    // The bodies are small: curl reads all of stdin before it answers.
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input)
            .map_err(|e| format!("writing to curl: {e}"))?;
    }
    child
        .wait_with_output()
        .map_err(|e| format!("waiting for curl: {e}"))
}

/// nginx-tls: the monolith, then nginx on a free port (retried with a fresh port when it was
/// taken in between).
pub(super) fn start_nginx_tls(
    chain: &[Step],
    opts: &StartOpts,
    dir: &Path,
) -> Result<RunningSystem> {
    let nginx = nginx_binary().map_err(|e| anyhow!(e))?;
    let cert = opts
        .tls
        .as_ref()
        .context("nginx-tls needs a certificate (StartOpts::tls)")?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = free_port()?;
        match start_on(&nginx, port, cert, chain, opts, dir) {
            Err(e) if attempt < 3 && format!("{e:#}").contains("in use") => continue,
            r => return r,
        }
    }
}

fn start_on(
    nginx: &Path,
    port: u16,
    cert: &Certificate,
    chain: &[Step],
    opts: &StartOpts,
    dir: &Path,
) -> Result<RunningSystem> {
    let mut sys = RunningSystem {
        id: SystemId::NginxTls,
        url: format!("https://127.0.0.1:{port}/bench"),
        components: Vec::new(),
        children: Vec::new(),
        descendants: Vec::new(),
        functions: Vec::new(),
        ca: Some(cert.cert.clone()),
    };
    let monolith = sys.spawn_fn(
        opts,
        super::FnServer::Hyper(1),
        chain,
        None,
        &dir.join("monolith.log"),
    )?;
    let upstream = sys.fn_url(sys.children.len() - 1)?;
    let conf = dir.join("nginx.conf");
    let text = nginx_tls_conf(
        dir,
        port,
        upstream.trim_start_matches("http://"),
        cert,
        effective_uid() == Some(0),
    );
    std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;
    let args = [
        "-p".into(),
        dir.as_os_str().to_owned(),
        "-c".into(),
        conf.into_os_string(),
        "-e".into(),
        dir.join("nginx-error.log").into_os_string(),
        "-g".into(),
        "daemon off;".into(),
    ];
    let i = sys.spawn(opts, nginx, &args, &dir.join("nginx-error.log"), false)?;
    sys.wait_ready(chain)?;
    let master = sys.children[i].child.id();
    sys.components.push(Component {
        name: "nginx".into(),
        pid: master,
    });
    sys.refresh_components();
    let workers = sys
        .components
        .iter()
        .filter(|c| c.name == "nginx-worker")
        .count();
    if workers != 1 {
        bail!("nginx (pid {master}) runs {workers} worker processes, expected 1");
    }
    sys.components.push(Component {
        name: "monolith".into(),
        pid: monolith,
    });
    Ok(sys)
}

/// nginx terminating TLS on `port` (HTTP/1.1 and h2 by ALPN) and proxying `location =
/// /bench` to the monolith at `upstream` over keep-alive HTTP/1.1; every path inside `dir`.
fn nginx_tls_conf(dir: &Path, port: u16, upstream: &str, cert: &Certificate, root: bool) -> String {
    let d = dir.display();
    let mut c = String::from(
        "# Generated by zerohop-bench: the nginx-tls baseline (TLS in front of the monolith).\n",
    );
    if root {
        // As root the worker would switch to `nobody` and lose access to the temp paths.
        c.push_str("user root;\n");
    }
    let _ = write!(
        c,
        r#"worker_processes 1;
pid "{d}/nginx.pid";
error_log "{d}/nginx-error.log" warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path "{d}/client_body";
    proxy_temp_path "{d}/proxy";
    fastcgi_temp_path "{d}/fastcgi";
    uwsgi_temp_path "{d}/uwsgi";
    scgi_temp_path "{d}/scgi";
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    http2_max_requests 1000000;
    client_max_body_size 2m;
    client_body_buffer_size 2m;
    proxy_buffering on;
    proxy_buffer_size 64k;
    proxy_buffers 32 64k;
    proxy_max_temp_file_size 0;
    proxy_read_timeout 30s;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate "{cert}";
    ssl_certificate_key "{key}";
    upstream monolith {{ server {upstream}; keepalive 1024; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        location = /bench {{ proxy_pass http://monolith; }}
    }}
}}
"#,
        cert = cert.cert.display(),
        key = cert.key.display(),
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_terminates_tls_with_h2_and_keeps_upstream_connections() {
        let cert = Certificate {
            cert: "/w/cert.pem".into(),
            key: "/w/key.pem".into(),
        };
        let conf = nginx_tls_conf(Path::new("/w"), 8443, "127.0.0.1:9", &cert, false);
        assert!(conf.contains("listen 127.0.0.1:8443 ssl http2;"));
        assert!(conf.contains("ssl_certificate \"/w/cert.pem\";"));
        assert!(conf.contains("ssl_certificate_key \"/w/key.pem\";"));
        assert!(conf.contains("upstream monolith { server 127.0.0.1:9; keepalive 1024;"));
        assert!(conf.contains("location = /bench { proxy_pass http://monolith; }"));
        assert!(conf.contains("proxy_set_header Connection \"\";"));
        assert!(!conf.contains("user root"));
    }

    #[test]
    fn the_spec_line_quotes_its_paths() {
        let cert = Certificate {
            cert: "/a b/cert.pem".into(),
            key: "/a b/key.pem".into(),
        };
        assert_eq!(
            cert.spec_line().unwrap(),
            "tls: { cert: \"/a b/cert.pem\", key: \"/a b/key.pem\" }\n"
        );
    }
}
