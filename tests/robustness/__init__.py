"""Bad and hostile input, injected faults and kill -9: every case a refusal, a counted skip or a resume."""
