module zerohop.dev/examples/polyglot

go 1.22

require zerohop.dev/zerohop v0.0.0

replace zerohop.dev/zerohop => ../../../sdk/go
