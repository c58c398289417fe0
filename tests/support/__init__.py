"""What several test tiers share, outside the product package."""
