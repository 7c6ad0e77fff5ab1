module zerohop.dev/apps/boutique/shipping

go 1.22

require zerohop.dev/zerohop v0.0.0

replace zerohop.dev/zerohop => ../../../../sdk/go
