"""The target model: where its snapshot lives, its remote code, tokenizer, text module and a card derived from it."""
