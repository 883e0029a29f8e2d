"""The chat itself: the conversation's messages as they stream, their figures, the input box and this chat's settings."""
