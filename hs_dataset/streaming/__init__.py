"""Online capture straight into training, through a bounded cache of verified shards."""
