//! Text cut to a limit in bytes: the API server counts bytes, not characters, and `×` or `→`
//! take two or three.

/// The longest start of `text` that fits in `bytes` bytes without splitting a character.
pub(super) fn truncate_bytes(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let end = (0..=bytes)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate_bytes;

    #[test]
    fn cuts_by_bytes_at_a_character_boundary() {
        // "×" and "→" are two and three bytes: 128 characters of them are far over 128 bytes.
        let note = "urgent 30/s × 20 ms × 2 = 1.2 → 2 → ".repeat(10);
        let action = truncate_bytes(&note, 128);
        assert!(
            action.len() <= 128 && action.len() >= 126,
            "{}",
            action.len()
        );
        assert!(note.starts_with(action));
        assert_eq!(truncate_bytes("→→", 4), "→");
        assert_eq!(truncate_bytes("→", 2), "");
        assert_eq!(truncate_bytes("short", 128), "short");
    }
}
