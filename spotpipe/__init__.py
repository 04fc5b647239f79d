"""spotpipe command-line tools."""
