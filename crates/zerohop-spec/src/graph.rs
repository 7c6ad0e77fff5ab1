//! Checks over the graph of functions: calls (static fan-outs included) form no cycle.

use crate::yaml::{shown_key, Cx};
use crate::*;

impl Cx {
    /// Calls (including static fan-outs) form no cycle: a caller waits for its callee, so a
    /// cycle could wait forever.
    pub(crate) fn no_call_cycle(&self, functions: &[FunctionSpec]) -> Result<(), SpecError> {
        let Some(cycle) = call_cycle(functions) else {
            return Ok(());
        };
        let f = functions
            .iter()
            .find(|f| f.name == cycle[0])
            .expect("names from the list");
        Err(self.err(
            f.line,
            &format!("functions.{}.calls", shown_key(&f.name)),
            format!(
                "calls form a cycle ({}); a caller waits for its callee's answer, so calls \
                 must not lead back to a function waiting on them (a route's fan_out counts \
                 as calls of its join)",
                cycle.join(" -> ")
            ),
        ))
    }
}

/// A cycle of calls, as names from the first function back to it, if there is one.
pub(crate) fn call_cycle(functions: &[FunctionSpec]) -> Option<Vec<String>> {
    fn visit(
        f: usize,
        functions: &[FunctionSpec],
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<String>> {
        // 0 unseen, 1 on the current path, 2 done.
        match state[f] {
            2 => return None,
            1 => {
                let start = path.iter().position(|&p| p == f).expect("on the path");
                let mut cycle: Vec<String> = path[start..]
                    .iter()
                    .map(|&p| functions[p].name.clone())
                    .collect();
                cycle.push(functions[f].name.clone());
                return Some(cycle);
            }
            _ => {}
        }
        state[f] = 1;
        path.push(f);
        for c in &functions[f].calls {
            if let Some(t) = functions.iter().position(|g| &g.name == c) {
                if let Some(cycle) = visit(t, functions, state, path) {
                    return Some(cycle);
                }
            }
        }
        path.pop();
        state[f] = 2;
        None
    }
    let mut state = vec![0u8; functions.len()];
    (0..functions.len()).find_map(|f| visit(f, functions, &mut state, &mut Vec::new()))
}
