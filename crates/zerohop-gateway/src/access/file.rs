//! A file the gateway reads for a route's access (a JWKS, API keys), read again when it
//! changes: looked at (one `stat`) at most once a second, on the request path; a new version
//! that cannot be used leaves the old one in place and is logged with why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Largest file accepted: a JWKS or a key list, not a database.
pub(crate) const MAX_FILE: u64 = 1 << 20;

/// How often the file's metadata is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What the file was when last read: modification time and length.
type Version = (SystemTime, u64);

/// The parsed contents of a file, kept current.
pub(crate) struct Watched<T> {
    path: PathBuf,
    parse: fn(&[u8]) -> Result<T, String>,
    state: Mutex<State<T>>,
}

struct State<T> {
    value: Arc<T>,
    version: Version,
    looked: Instant,
}

impl<T> Watched<T> {
    /// Reads and parses `path` now; the error names the file and what is wrong.
    pub(crate) fn open(path: &Path, parse: fn(&[u8]) -> Result<T, String>) -> Result<Self, String> {
        let (bytes, version) = read(path)?;
        let value = parse(&bytes).map_err(|why| format!("{}: {why}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            parse,
            state: Mutex::new(State {
                value: Arc::new(value),
                version,
                looked: Instant::now(),
            }),
        })
    }

    /// The contents, read again first if the file changed (looked at once a second at most).
    pub(crate) fn get(&self) -> Arc<T> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.looked.elapsed() >= LOOK_EVERY {
            s.looked = Instant::now();
            let now = std::fs::metadata(&self.path)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())));
            if now.is_some_and(|v| v != s.version) {
                match read(&self.path).and_then(|(bytes, version)| {
                    let v = (self.parse)(&bytes)
                        .map_err(|why| format!("{}: {why}", self.path.display()))?;
                    Ok((v, version))
                }) {
                    Ok((v, version)) => {
                        tracing::info!("gateway: read {} again", self.path.display());
                        s.value = Arc::new(v);
                        s.version = version;
                    }
                    Err(why) => {
                        tracing::warn!("gateway: kept the previous version: {why}");
                        // Not again until the file changes once more.
                        if let Some(v) = now {
                            s.version = v;
                        }
                    }
                }
            }
        }
        s.value.clone()
    }
}

/// The file's bytes (at most [`MAX_FILE`]) and version.
fn read(path: &Path) -> Result<(Vec<u8>, Version), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if meta.len() > MAX_FILE {
        return Err(format!(
            "{shown}: {} bytes, more than the {MAX_FILE} this file may have",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("{shown}: grew past {MAX_FILE} bytes while read"));
    }
    let version = (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    );
    Ok((bytes, version))
}
