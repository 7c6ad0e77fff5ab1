//! `zerohop logs NAME [FUNCTION]`: a chain's last log lines, then (when followed) every new
//! one, as JSON lines.

use super::error::DaemonError;
use super::state::Daemon;

impl Daemon {
    /// `zerohop logs NAME [FUNCTION]`: the last `lines` lines (of `function`, or all), then
    /// with `follow` every new one until the client goes or the chain does; JSON lines on the
    /// returned channel. A follower too slow for the chain's output is told how many lines
    /// it missed, in a line of its own.
    pub fn logs(
        &self,
        name: &str,
        function: Option<&str>,
        lines: usize,
        follow: bool,
    ) -> Result<tokio::sync::mpsc::Receiver<bytes::Bytes>, DaemonError> {
        let view = self.view(name)?;
        let book = view.logs();
        if let Some(f) = function {
            if !book.functions().any(|n| n == f) {
                return Err(DaemonError::BadRequest(format!(
                    "chain '{name}' has no function '{f}'; its functions: {}",
                    book.functions().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        // Subscribe before the snapshot, so no line falls between them (seq dedupes).
        let mut live = follow.then(|| book.follow());
        let past = book.snapshot(function, lines);
        let last_seq = past.last().map(|l| l.seq);
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let function = function.map(str::to_owned);
        let encode = |l: &crate::logs::LogLine| {
            let mut v = serde_json::to_vec(&crate::api::LogEntry {
                time: crate::logs::rfc3339(l.time),
                chain: l.chain.to_string(),
                function: l.function.to_string(),
                instance: l.instance,
                stream: l.stream.as_str().to_owned(),
                text: l.text.clone(),
            })
            .unwrap_or_default();
            v.push(b'\n');
            bytes::Bytes::from(v)
        };
        let chain = name.to_owned();
        tokio::spawn(async move {
            for l in &past {
                if tx.send(encode(l)).await.is_err() {
                    return;
                }
            }
            let Some(live) = live.as_mut() else { return };
            loop {
                let line = tokio::select! {
                    r = live.recv() => r,
                    _ = tx.closed() => return,
                };
                match line {
                    Ok(l) => {
                        if last_seq.is_some_and(|s| l.seq <= s)
                            || function.as_deref().is_some_and(|f| *l.function != *f)
                        {
                            continue;
                        }
                        if tx.send(encode(&l)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let note = crate::logs::LogLine {
                            seq: 0,
                            time: std::time::SystemTime::now(),
                            chain: chain.as_str().into(),
                            function: "zerohop".into(),
                            instance: 0,
                            stream: crate::logs::Stream::Stderr,
                            text: format!("[{n} lines skipped: this follower fell behind]"),
                            cut: false,
                        };
                        if tx.send(encode(&note)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(rx)
    }
}
