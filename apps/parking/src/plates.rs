//! The plate store: an embedded SQLite database (compiled in, `rusqlite`'s `bundled`) in a
//! file that outlives the chain, shared by the search and persist functions.
//!
//! One table, `plates(plate PRIMARY KEY, tariff_cents, first_seen_ms, first_spot)`. The
//! database runs in WAL mode (readers never wait for the writer; both functions may have
//! several instances) with `synchronous = NORMAL`: a commit survives any process crash or
//! kill (the chain stopping, an instance killed), and only a power loss may lose the last
//! commits. Writers wait up to 5 s for each other (`busy_timeout`).
//!
//! The file is `plates.db` in the chain's data folder (`$ZEROHOP_DATA`, which the agent
//! creates and gives to the chain's uid: SQLite creates the `-wal` and `-shm` files beside
//! it), or the file `PARKING_DB` names.

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

/// Environment variable naming the database file (an absolute path), when it is not
/// `plates.db` in the chain's data folder.
pub const DB_ENV: &str = "PARKING_DB";

/// The chain's data folder, as the agent names it to every function (`data:` in the spec).
pub const DATA_ENV: &str = "ZEROHOP_DATA";

/// How long a writer waits for another.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither [`DB_ENV`] nor [`DATA_ENV`] is set.
    #[error(
        "neither {DATA_ENV} nor {DB_ENV} is set: give the chain a data folder (`data: true` in \
         its spec) or the database file's absolute path in the function's env"
    )]
    NoPath,
    /// SQLite failed; `doing` says at what.
    #[error("plate store {path}: {doing}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// What was being done (`open`, `create table`, `find`, `insert`).
        doing: &'static str,
        /// SQLite's error.
        source: rusqlite::Error,
    },
}

/// What the store knows of a plate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plate {
    /// The plate.
    pub plate: String,
    /// Its tariff per period.
    pub tariff_cents: u32,
    /// When it was first seen (snapshot time, ms since the epoch).
    pub first_seen_ms: u64,
    /// Where it was first seen.
    pub first_spot: u32,
}

/// An open plate store.
pub struct PlateStore {
    conn: Connection,
    path: String,
}

impl PlateStore {
    /// Opens the store named by [`DB_ENV`], else `plates.db` in [`DATA_ENV`].
    pub fn open_from_env() -> Result<Self, StoreError> {
        match (std::env::var_os(DB_ENV), std::env::var_os(DATA_ENV)) {
            (Some(file), _) => Self::open(Path::new(&file)),
            (None, Some(dir)) => Self::open(&Path::new(&dir).join("plates.db")),
            (None, None) => Err(StoreError::NoPath),
        }
    }

    /// Opens (creating when needed) the store in `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let name = path.display().to_string();
        let err = |doing| {
            let path = name.clone();
            move |source| StoreError::Sqlite {
                path,
                doing,
                source,
            }
        };
        let conn = Connection::open(path).map_err(err("open"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(err("busy_timeout"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err("journal_mode = WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err("synchronous = NORMAL"))?;
        conn.execute(
            "CREATE TABLE IF NOT EXISTS plates (
                plate TEXT PRIMARY KEY NOT NULL,
                tariff_cents INTEGER NOT NULL,
                first_seen_ms INTEGER NOT NULL,
                first_spot INTEGER NOT NULL
            )",
            [],
        )
        .map_err(err("create table"))?;
        Ok(Self { conn, path: name })
    }

    fn error(&self, doing: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            doing,
            source,
        }
    }

    /// What the store knows of `plate`.
    pub fn find(&self, plate: &str) -> Result<Option<Plate>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT plate, tariff_cents, first_seen_ms, first_spot FROM plates WHERE plate = ?1",
            )
            .and_then(|mut s| {
                s.query_row(params![plate], |r| {
                    Ok(Plate {
                        plate: r.get(0)?,
                        tariff_cents: r.get(1)?,
                        first_seen_ms: r.get::<_, i64>(2)? as u64,
                        first_spot: r.get(3)?,
                    })
                })
                .optional()
            })
            .map_err(self.error("find"))
    }

    /// Registers `plate` unless it is known already; returns what the store holds now and
    /// whether this call registered it.
    pub fn register(&self, plate: &Plate) -> Result<(Plate, bool), StoreError> {
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO plates (plate, tariff_cents, first_seen_ms, first_spot)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    plate.plate,
                    plate.tariff_cents,
                    plate.first_seen_ms as i64,
                    plate.first_spot
                ])
            })
            .map_err(self.error("insert"))?;
        if inserted == 1 {
            return Ok((plate.clone(), true));
        }
        // Registered meanwhile by another instance: its record wins.
        let stored = self.find(&plate.plate)?.unwrap_or_else(|| plate.clone());
        Ok((stored, false))
    }

    /// Number of plates stored.
    pub fn count(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT COUNT(*) FROM plates", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(self.error("count"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plate(p: &str) -> Plate {
        Plate {
            plate: p.into(),
            tariff_cents: 250,
            first_seen_ms: 7,
            first_spot: 3,
        }
    }

    #[test]
    fn a_registered_plate_is_found_and_survives_reopening() {
        let dir = tempfile::Builder::new()
            .prefix("parking-store-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("plates.db");
        {
            let s = PlateStore::open(&file).unwrap();
            assert_eq!(s.find("AB123CD").unwrap(), None);
            assert_eq!(
                s.register(&plate("AB123CD")).unwrap(),
                (plate("AB123CD"), true)
            );
            let again = Plate {
                tariff_cents: 1,
                ..plate("AB123CD")
            };
            // The first registration wins.
            assert_eq!(s.register(&again).unwrap(), (plate("AB123CD"), false));
        }
        let s = PlateStore::open(&file).unwrap();
        assert_eq!(s.find("AB123CD").unwrap(), Some(plate("AB123CD")));
        assert_eq!(s.count().unwrap(), 1);
    }
}
