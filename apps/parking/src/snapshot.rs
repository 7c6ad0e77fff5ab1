//! A camera's snapshot of one parking spot, synthesised: SPRIGHT sends CNR-Park+EXT images
//! (150 x 150 pixels, ~3 KB) that cannot be fetched here, so a snapshot is one text line
//! naming what the picture shows (camera, spot, plate, time) followed by filler bytes up to
//! the image's size. The detection function reads the line where a model would read pixels.
//!
//! ```text
//! SNAP camera=0 spot=17 plate=KX482TB t_ms=1795490978000\n<filler ... up to 3 KB>
//! ```

/// SPRIGHT's snapshot size.
pub const DEFAULT_SIZE: usize = 3 * 1024;

/// What went wrong with a snapshot (the camera's fault: 400, or 422 for no plate).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No `SNAP ...` line at the start.
    #[error("not a snapshot: it starts with no `SNAP camera=.. spot=.. plate=.. t_ms=..` line")]
    NoHeader,
    /// A field is missing or not a number.
    #[error("snapshot field `{0}` is missing or malformed")]
    BadField(&'static str),
    /// The plate could not be read (not 2 to 10 letters and digits).
    #[error("no readable plate in the snapshot: {0:?}")]
    NoPlate(String),
}

/// What a snapshot shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The camera that took it.
    pub camera: u32,
    /// The parking spot.
    pub spot: u32,
    /// The car's plate.
    pub plate: String,
    /// When, ms since the Unix epoch (camera clock).
    pub t_ms: u64,
}

/// Whether `plate` looks like a plate: 2 to 10 ASCII capital letters and digits.
pub fn valid_plate(plate: &str) -> bool {
    (2..=10).contains(&plate.len())
        && plate
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

impl Snapshot {
    /// The snapshot as a camera sends it: the line, then filler up to `size` bytes (the line
    /// alone when it is longer).
    pub fn encode(&self, size: usize) -> Vec<u8> {
        let mut out = format!(
            "SNAP camera={} spot={} plate={} t_ms={}\n",
            self.camera, self.spot, self.plate, self.t_ms
        )
        .into_bytes();
        // Filler: bytes that look like compressed image data, different per snapshot.
        let mut x = u64::from(self.spot) << 32 ^ self.t_ms ^ 0x2545_f491_4f6c_dd1d;
        while out.len() < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push(x as u8);
        }
        out
    }

    /// Reads what a snapshot shows.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let end = bytes
            .iter()
            .take(256)
            .position(|&b| b == b'\n')
            .ok_or(SnapshotError::NoHeader)?;
        let line = std::str::from_utf8(&bytes[..end]).map_err(|_| SnapshotError::NoHeader)?;
        let mut words = line.split(' ');
        if words.next() != Some("SNAP") {
            return Err(SnapshotError::NoHeader);
        }
        let fields: Vec<(&str, &str)> = words.filter_map(|w| w.split_once('=')).collect();
        let field = |name: &'static str| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| *v)
                .ok_or(SnapshotError::BadField(name))
        };
        let number = |name: &'static str| {
            field(name)?
                .parse::<u64>()
                .map_err(|_| SnapshotError::BadField(name))
        };
        let plate = field("plate")?;
        if !valid_plate(plate) {
            return Err(SnapshotError::NoPlate(plate.chars().take(32).collect()));
        }
        Ok(Self {
            camera: u32::try_from(number("camera")?)
                .map_err(|_| SnapshotError::BadField("camera"))?,
            spot: u32::try_from(number("spot")?).map_err(|_| SnapshotError::BadField("spot"))?,
            plate: plate.to_owned(),
            t_ms: number("t_ms")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_3_kb_and_reads_back() {
        let s = Snapshot {
            camera: 2,
            spot: 163,
            plate: "KX482TB".into(),
            t_ms: 1_700_000_000_000,
        };
        let bytes = s.encode(DEFAULT_SIZE);
        assert_eq!(bytes.len(), DEFAULT_SIZE);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
    }

    #[test]
    fn bad_snapshots_are_refused() {
        assert!(matches!(
            Snapshot::decode(b"JPEG...."),
            Err(SnapshotError::NoHeader)
        ));
        assert!(matches!(
            Snapshot::decode(b"SNAP camera=1 spot=x plate=AB12 t_ms=1\n"),
            Err(SnapshotError::BadField("spot"))
        ));
        assert!(matches!(
            Snapshot::decode(b"SNAP camera=1 spot=2 plate=ab-1 t_ms=1\n"),
            Err(SnapshotError::NoPlate(_))
        ));
    }
}
