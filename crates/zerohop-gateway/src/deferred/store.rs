//! The deferred requests' folder: one file per request in `queue/` (accepted, not finished),
//! `done/` (its result) or `dlq/` (dead letters), written whole in `tmp/`, fsynced, renamed
//! into place and the folder fsynced, so a file that is there after a crash is whole and was
//! there before the answer that depended on it (the 202, a recorded result).
//!
//! A file is one line of JSON (what the request or result is), a line break, then the body as
//! it is. Ids are 32 lower-case hex digits (128 random bits); nothing else is ever taken as a
//! file name.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Longest head line [`Store::open_body`] reads (metadata, headers, a callback URL: far less).
const MAX_HEAD: usize = 1 << 20;

/// Accepted requests that have not finished.
pub(crate) const QUEUE: &str = "queue";
/// Results (status, headers, body).
pub(crate) const DONE: &str = "done";
/// Dead letters: the request with its last error.
pub(crate) const DLQ: &str = "dlq";
const TMP: &str = "tmp";

/// Whether `id` is a request id (and so a safe file name).
pub(crate) fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A folder of deferred requests; made on the first write, so a chain that never takes an
/// async request leaves nothing behind.
#[derive(Debug)]
pub(crate) struct Store {
    dir: PathBuf,
    /// Set once the folder and its sub-folders exist.
    made: std::sync::OnceLock<()>,
}

impl Store {
    /// Opens `dir` if it exists (throwing away half-written files), else only remembers it.
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        let s = Self {
            dir: dir.to_owned(),
            made: std::sync::OnceLock::new(),
        };
        if dir.exists() {
            s.make()?;
            for e in fs::read_dir(dir.join(TMP))? {
                let _ = fs::remove_file(e?.path());
            }
        }
        Ok(s)
    }

    /// Makes the folder and its sub-folders (mode 0700) unless that was done.
    fn make(&self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        if self.made.get().is_some() {
            return Ok(());
        }
        for sub in [QUEUE, DONE, DLQ, TMP] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.dir.join(sub))?;
        }
        sync_dir(&self.dir)?;
        if let Some(parent) = self.dir.parent() {
            sync_dir(parent)?;
        }
        let _ = self.made.set(());
        Ok(())
    }

    /// The folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `sub/id` durably: whole or not at all.
    pub(crate) fn put(&self, sub: &str, id: &str, head: &Value, body: &[u8]) -> io::Result<()> {
        self.make()?;
        let tmp = self.dir.join(TMP).join(format!("{id}.{sub}"));
        let mut f = File::create(&tmp)?;
        let mut line = serde_json::to_vec(head).map_err(io::Error::other)?;
        line.push(b'\n');
        f.write_all(&line)?;
        f.write_all(body)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.path(sub, id))?;
        sync_dir(&self.dir.join(sub))
    }

    /// Reads `sub/id`: its head and body.
    pub(crate) fn get(&self, sub: &str, id: &str) -> io::Result<(Value, Vec<u8>)> {
        let mut data = fs::read(self.path(sub, id))?;
        let nl = data
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no head line"))?;
        let head = serde_json::from_slice(&data[..nl])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        data.drain(..=nl);
        Ok((head, data))
    }

    /// Opens `sub/id` to read its body: its head, and the file positioned at the body with
    /// the body's length. The head line is read a buffer at a time; one longer than
    /// [`MAX_HEAD`] is refused (the store writes none that long).
    pub(crate) fn open_body(&self, sub: &str, id: &str) -> io::Result<(Value, File, u64)> {
        use std::io::{BufRead, BufReader, Seek, SeekFrom};
        let file = File::open(self.path(sub, id))?;
        let total = file.metadata()?.len();
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        (&mut reader)
            .take(MAX_HEAD as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if line.last() != Some(&b'\n') {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no head line"));
        }
        let head = serde_json::from_slice(&line[..line.len() - 1])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let at = line.len() as u64;
        let mut file = reader.into_inner();
        file.seek(SeekFrom::Start(at))?;
        Ok((head, file, total.saturating_sub(at)))
    }

    /// The size in bytes of `sub/id` (its head line and body).
    pub(crate) fn size(&self, sub: &str, id: &str) -> io::Result<u64> {
        fs::metadata(self.path(sub, id)).map(|m| m.len())
    }

    /// Whether `sub/id` exists.
    pub(crate) fn has(&self, sub: &str, id: &str) -> bool {
        self.path(sub, id).exists()
    }

    /// Removes `sub/id` durably (gone is fine).
    pub(crate) fn remove(&self, sub: &str, id: &str) -> io::Result<()> {
        match fs::remove_file(self.path(sub, id)) {
            Ok(()) => sync_dir(&self.dir.join(sub)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The ids in `sub`, oldest file first.
    pub(crate) fn ids(&self, sub: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        let list = match fs::read_dir(self.dir.join(sub)) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        for e in list {
            let e = e?;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !valid_id(&name) {
                continue;
            }
            let t = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            out.push((t, name));
        }
        out.sort();
        Ok(out.into_iter().map(|(_, n)| n).collect())
    }

    fn path(&self, sub: &str, id: &str) -> PathBuf {
        debug_assert!(valid_id(id));
        self.dir.join(sub).join(id)
    }
}

/// fsync of a folder: makes the names in it (a rename, a removal) durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_only() {
        assert!(valid_id("0123456789abcdef0123456789abcdef"));
        for bad in [
            "",
            "0123456789abcdef0123456789abcde",
            "0123456789ABCDEF0123456789abcdef",
            "../../../../../../../../etc/pass",
            "0123456789abcdef0123456789abcde/",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn put_get_remove_and_half_written_files() {
        let dir = std::env::temp_dir().join(format!("zh-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = Store::open(&dir).unwrap();
        assert!(!dir.exists(), "made on the first write only");
        assert!(s.ids(QUEUE).unwrap().is_empty());
        let id = "0123456789abcdef0123456789abcdef";
        let head = serde_json::json!({ "route": "POST /x" });
        s.put(QUEUE, id, &head, b"body\nwith lines").unwrap();
        assert!(s.has(QUEUE, id));
        let (h, b) = s.get(QUEUE, id).unwrap();
        assert_eq!((h, b.as_slice()), (head.clone(), &b"body\nwith lines"[..]));
        // Opened for its body: the head, the file at the body, the body's length.
        let (h, mut f, len) = s.open_body(QUEUE, id).unwrap();
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).unwrap();
        assert_eq!(
            (h, len, rest.as_slice()),
            (head, 15, &b"body\nwith lines"[..])
        );
        fs::write(dir.join(DONE).join(id), b"{\"no\": \"line break\"}").unwrap();
        assert!(
            s.open_body(DONE, id).is_err(),
            "a head without its line break"
        );
        assert_eq!(s.ids(QUEUE).unwrap(), vec![id.to_owned()]);
        fs::write(dir.join(TMP).join("x.queue"), b"half").unwrap();
        fs::write(dir.join(QUEUE).join("not-an-id"), b"").unwrap();
        let s = Store::open(&dir).unwrap();
        assert_eq!(fs::read_dir(dir.join(TMP)).unwrap().count(), 0);
        assert_eq!(s.ids(QUEUE).unwrap(), vec![id.to_owned()]);
        s.remove(QUEUE, id).unwrap();
        s.remove(QUEUE, id).unwrap();
        assert!(!s.has(QUEUE, id));
        fs::remove_dir_all(&dir).unwrap();
    }
}
