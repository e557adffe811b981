"""End-to-end tests: real SGLang servers, the trainers' own code, the datasets builder, the Hub stand-in."""
