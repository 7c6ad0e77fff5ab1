module zerohop.dev/bench/languages

go 1.22

require zerohop.dev/zerohop v0.0.0

replace zerohop.dev/zerohop => ../../../sdk/go
