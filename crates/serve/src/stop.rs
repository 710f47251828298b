//! Stop strings, matched in the text as the engine makes it: across token boundaries, and never
//! sent. Text that could still begin a stop string is held back until the next token decides it.

/// One answer's stop strings and the text held back for them.
#[derive(Debug, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    held: String,
}

/// What [`StopText::feed`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Fed {
    /// Text that can be sent.
    pub text: String,
    /// Whether a stop string appeared: the answer ends before it.
    pub stopped: bool,
}

impl StopText {
    pub fn new(stops: Vec<String>) -> Self {
        debug_assert!(stops.iter().all(|s| !s.is_empty()), "the request checks refuse an empty stop string");
        StopText { stops, held: String::new() }
    }

    /// Takes the next piece of text: returns what may be sent, cut before the first stop string
    /// if one now appears.
    pub fn feed(&mut self, text: &str) -> Fed {
        if self.stops.is_empty() {
            return Fed { text: text.to_string(), stopped: false };
        }
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Fed { text, stopped: true };
        }
        // Hold back the longest tail that a stop string starts with (on a character boundary).
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0).min(self.held.len());
        let keep = (1..=longest)
            .rev()
            .map(|n| self.held.len() - n)
            .filter(|&at| self.held.is_char_boundary(at))
            .find(|&at| self.stops.iter().any(|s| s.starts_with(&self.held[at..])))
            .map_or(0, |at| self.held.len() - at);
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Fed { text, stopped: false }
    }

    /// The text held back, at the end of an answer no stop string ended.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns the text sent, whether it stopped, and at which piece.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut sent = String::new();
        for (i, piece) in pieces.iter().enumerate() {
            let fed = s.feed(piece);
            sent.push_str(&fed.text);
            if fed.stopped {
                return (sent, Some(i));
            }
        }
        sent.push_str(&s.flush());
        (sent, None)
    }

    #[test]
    fn a_stop_string_split_across_pieces_ends_the_text_before_it() {
        assert_eq!(run(&["END"], &["Hello E", "N", "Dgame"]), ("Hello ".into(), Some(2)));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some(1)));
        // The earliest of several.
        assert_eq!(run(&["zz", "b"], &["abzz"]), ("a".into(), Some(0)));
    }

    #[test]
    fn text_that_only_began_a_stop_string_is_sent_in_the_end() {
        assert_eq!(run(&["END"], &["Hello E", "N", "d"]), ("Hello ENd".into(), None));
        assert_eq!(run(&["END"], &["Hello EN"]), ("Hello EN".into(), None));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn held_text_is_only_what_could_still_begin_a_stop() {
        let mut s = StopText::new(vec!["über".into()]);
        assert_eq!(s.feed("grün ü"), Fed { text: "grün ".into(), stopped: false });
        assert_eq!(s.feed("x"), Fed { text: "üx".into(), stopped: false });
        assert_eq!(s.feed("üb"), Fed { text: String::new(), stopped: false });
        assert_eq!(s.feed("er alles"), Fed { text: String::new(), stopped: true });
    }
}
