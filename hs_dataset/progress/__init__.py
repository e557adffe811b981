"""What a long command shows while it runs, wherever its output goes (a terminal's bar, or a log's plain lines)."""
